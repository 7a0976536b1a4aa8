"""Addresses of a server given on the command line: http(s)://HOST[:PORT], checked once.

A URL that carries a user name or password is refused without being repeated: the
credential would otherwise reach the error, a unit file or a log. Every other mistake is
named with the value, so the operator sees what they typed.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from aiworker.errors import InvalidInput


def http_origin(value: str, what: str, code: str | None = None) -> str:
    """VALUE as `scheme://host[:port]` (a trailing slash dropped); InvalidInput naming
    WHAT (with CODE, if given) for anything else: another scheme, a path, a query or a
    fragment, credentials, a port that is no number in 1..65535, or a malformed URL."""
    if "@" in value:  # wherever a parser would put it, a credential may be in there
        raise InvalidInput(
            f"{what} must not carry a user name or password (the value is not shown): "
            "name only http(s)://HOST[:PORT]",
            code=code,
        )
    expected = f"{what} {value!r} must be http(s)://HOST[:PORT]"
    if any(c.isspace() for c in value) or value.rstrip("/").endswith(":"):
        raise InvalidInput(expected, code=code)
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise InvalidInput(
            f"{what} {value!r} is not a well-formed URL ({exc}): expected http(s)://HOST[:PORT]",
            code=code,
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise InvalidInput(expected, code=code)
    if parts.path not in ("", "/") or parts.query or parts.fragment or value.endswith("?"):
        raise InvalidInput(f"{expected}, with no path or query", code=code)
    return f"{parts.scheme}://{parts.netloc}"
