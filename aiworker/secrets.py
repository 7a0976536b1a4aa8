"""Process-wide redaction of secret values: tokens never reach output, logs or errors."""

from __future__ import annotations

import re
import threading

MASK = "***"
_lock = threading.Lock()
_secrets: set[str] = set()
# Short values would mask ordinary words; a real token is never this short.
MIN_SECRET_LENGTH = 6


# A token is one printable ASCII word: anything else (two lines, spaces, control or
# non-ASCII characters) is refused before it can reach a header (HTTP headers carry
# Latin-1 at most), an error message or a log.
TOKEN = re.compile(r"^[\x21-\x7e]{1,4096}$")
TOKEN_RULE = "one token of printable ASCII characters, no spaces"  # noqa: S105 (a rule)


def register_secret(value: str) -> None:
    """Mask VALUE, and the forms it takes when it is escaped into JSON, a Python repr or
    a URL, wherever text leaves the process."""
    if len(value) >= MIN_SECRET_LENGTH:
        import json
        from urllib.parse import quote

        forms = {value, json.dumps(value)[1:-1], repr(value)[1:-1], quote(value, safe="")}
        with _lock:
            _secrets.update(form for form in forms if len(form) >= MIN_SECRET_LENGTH)


def registered() -> list[str]:
    """Every registered secret, in each of its forms: for masking output that is not text
    of this process (a job's streams)."""
    with _lock:
        return sorted(_secrets)


def redact(text: str) -> str:
    with _lock:
        values = sorted(_secrets, key=len, reverse=True)
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    return redact_url_password(text)


_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@\s]+)(@)", re.IGNORECASE)
# libpq also takes the password as a query parameter (postgresql://u@host/db?password=...),
# and the client key's passphrase as sslpassword=.
# It ends where the parameter or the quoted string holding the URL ends (a JSON document
# stays one).
_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)([^&#\s\"'\\]+)", re.IGNORECASE)


def redact_url_password(text: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + m.group(3), text)
    return _QUERY_PASSWORD.sub(lambda m: m.group(1) + MASK, text)


def url_passwords(url: str) -> list[str]:
    """The passwords a URL carries: after its user name, and as a password= parameter
    (as written, and decoded)."""
    from urllib.parse import unquote

    found = [m.group(2) for m in _URL_PASSWORD.finditer(url)]
    found += [m.group(2) for m in _QUERY_PASSWORD.finditer(url)]
    return [form for value in found for form in {value, unquote(value)}]
