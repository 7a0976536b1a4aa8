"""Process-wide redaction of secret values: tokens never reach output, logs or errors."""

from __future__ import annotations

import re
import threading

MASK = "***"
_lock = threading.Lock()
_secrets: set[str] = set()
# Short values would mask ordinary words; a real token is never this short.
MIN_SECRET_LENGTH = 6


def register_secret(value: str) -> None:
    if len(value) >= MIN_SECRET_LENGTH:
        with _lock:
            _secrets.add(value)


def redact(text: str) -> str:
    with _lock:
        values = sorted(_secrets, key=len, reverse=True)
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    return redact_url_password(text)


_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@\s]+)(@)", re.IGNORECASE)


def redact_url_password(text: str) -> str:
    return _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + m.group(3), text)
