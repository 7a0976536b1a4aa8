"""Request protection for the operator API, in front of every route.

Every request's Host must be one the server is bound as (a DNS-rebinding page cannot
reach it under another name). A mutation also needs a permitted Origin when the browser
sends one, and the double-submit CSRF token: the `aiworker_csrf` cookie issued by
`GET /api/v1/session` and the same value in an `X-CSRF-Token` header. Bodies are
bounded. Refusals use the CLI's error shape and change nothing.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CSRF_COOKIE = "aiworker_csrf"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MAX_BODY_BYTES = 64 * 1024


async def refuse(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def cookie_value(header: str, name: str) -> str | None:
    """NAME's value in a Cookie header, read leniently: another localhost application's
    malformed cookie (cookies are not kept apart by port) must not hide ours."""
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value.strip()
    return None


class Protection:
    def __init__(
        self,
        app: ASGIApp,
        hosts: set[str],
        *,
        origins: set[str] | None = None,
        max_body: int = MAX_BODY_BYTES,
        check_host: bool = True,
        check_csrf: bool = True,
    ) -> None:
        # The runner listener checks neither: its callers are other hosts with bearer
        # tokens and no cookies, so there is no browser to forge a request for them.
        self.check_host, self.check_csrf = check_host, check_csrf
        self.app = app
        self.hosts = hosts
        self.origins = origins if origins is not None else {f"http://{host}" for host in hosts}
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websocket routes: anything else is closed
            await send({"type": "websocket.close", "code": 1008})
            return
        headers: dict[str, str] = {}
        for key, value in scope["headers"]:
            headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
        if self.check_host and headers.get("host", "") not in self.hosts:
            await refuse(send, 421, "forbidden_host", "this server answers only to its own address")
            return
        if scope["method"] not in SAFE_METHODS:
            why = self._mutation_refused(headers) if self.check_csrf else None
            if why is not None:
                await refuse(send, 403, why[0], why[1])
                return
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                length = self.max_body + 1
            if length > self.max_body:
                await refuse(send, 413, "too_large", f"bodies are at most {self.max_body} bytes")
                return
            receive = self._bounded(receive)
        await self.app(scope, receive, send)

    def _mutation_refused(self, headers: dict[str, str]) -> tuple[str, str] | None:
        origin = headers.get("origin")
        if origin is not None and origin not in self.origins:
            return "forbidden_origin", f"requests from {origin[:100]} are not accepted"
        cookie = cookie_value(headers.get("cookie", ""), CSRF_COOKIE)
        token = headers.get(CSRF_HEADER)
        if not cookie or not token or not hmac.compare_digest(cookie.encode(), token.encode()):
            return "csrf", (
                "a change needs the CSRF token from GET /api/v1/session in the "
                f"{CSRF_COOKIE} cookie and the X-CSRF-Token header"
            )
        return None

    def _bounded(self, receive: Receive) -> Receive:
        """A body sent without a truthful length is cut off at the bound."""
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                return {"type": "http.disconnect"}
            return message

        return bounded
