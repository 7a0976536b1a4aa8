"""Why an HTTP request (to the forge, to the controller's runner API) failed, in an
operator's words: a connection's failure and whether waiting may cure it, and how long a
Retry-After asks to wait."""

from __future__ import annotations

import email.utils
import socket
import time

import requests
import urllib3

DNS = ("the host name does not resolve (DNS)", False)
REFUSED = ("connection refused (nothing listens there)", True)


def connection_cause(exc: requests.RequestException, timeout: float) -> tuple[str, bool]:
    """EXC in an operator's words, and whether waiting may cure it (a refused connection
    or a timeout may; an unknown host name or a failed TLS handshake needs the operator)."""
    if isinstance(exc, requests.exceptions.SSLError):
        return "the TLS handshake failed (certificate or protocol)", False
    if isinstance(exc, requests.Timeout):
        return f"no answer within {timeout:g} s (timeout)", True
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, socket.gaierror) or "Name or service not known" in str(seen):
            return DNS
        if isinstance(seen, ConnectionRefusedError):
            return REFUSED
        seen = seen.__cause__ or seen.__context__ or _wrapped(seen)
    if "Failed to resolve" in str(exc):
        return DNS
    return (
        REFUSED
        if "Connection refused" in str(exc)
        else (f"the connection failed ({type(exc).__name__})", True)
    )


def before_sending(exc: requests.RequestException) -> bool:
    """Whether EXC ended the call before its request could reach the server: no connection
    was made (refused, a name that does not resolve, a connect timeout, a failed TLS
    handshake). Any other failure may come after the server took the request."""
    if isinstance(exc, requests.exceptions.ConnectTimeout | requests.exceptions.SSLError):
        return True
    seen: BaseException | None = exc
    while seen is not None:
        unmade = urllib3.exceptions.NewConnectionError, ConnectionRefusedError, socket.gaierror
        if isinstance(seen, unmade):
            return True
        seen = seen.__cause__ or seen.__context__ or _wrapped(seen)
    return False


def _wrapped(exc: BaseException) -> BaseException | None:
    """urllib3 keeps the underlying error in `reason` rather than as a cause."""
    inner = getattr(exc, "reason", None)
    if isinstance(inner, BaseException) and inner is not exc:
        return inner
    args = [a for a in getattr(exc, "args", ()) if isinstance(a, BaseException)]
    return args[0] if args else None


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: a number, or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))
