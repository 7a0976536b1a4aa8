"""Request protection for the operator API, in front of every route.

Every request's Host must be one the server is bound as (a DNS-rebinding page cannot
reach it under another name). A mutation also needs a permitted Origin when the browser
sends one, and the double-submit CSRF token: the `aiworker_csrf` cookie issued by
`GET /api/v1/session` and the same value in an `X-CSRF-Token` header. The token is
the server's own: a random value and its HMAC under a key kept in the state
directory, so a value a client made up (set in both places) is refused. Bodies are
bounded. Every answer says `X-Content-Type-Options: nosniff`. Refusals use the CLI's
error shape and change nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
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


KEY_BYTES = 32


class CsrfTokens:
    """Tokens this server issued: NONCE.MAC, the MAC an HMAC-SHA256 of the nonce."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def of_state_dir(cls, state_dir: Path) -> CsrfTokens:
        """The key in STATE_DIR/web/csrf.key (0600), made once; tokens survive restarts."""
        path = state_dir / "web" / "csrf.key"
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            key = path.read_bytes()
            if len(key) == KEY_BYTES:
                return cls(key)
            raise RuntimeError(f"{path} is not a key this server wrote; remove it") from None
        key = secrets.token_bytes(KEY_BYTES)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key)
        return cls(key)

    def _mac(self, nonce: str) -> str:
        digest = hmac.new(self._key, nonce.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def issue(self) -> str:
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._mac(nonce)}"

    def valid(self, token: str | None) -> bool:
        nonce, sep, mac = (token or "").partition(".")
        if not sep or not nonce or len(token or "") > 200:
            return False
        return hmac.compare_digest(mac.encode(), self._mac(nonce).encode())


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
                (b"x-content-type-options", b"nosniff"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def cookie_values(header: str, name: str) -> list[str]:
    """Every value of NAME in a Cookie header, read leniently. Cookies are not kept apart
    by port: another localhost application's malformed cookie must not hide ours, and
    its cookie of our name (a longer path is sent first) must not shadow ours."""
    values = []
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            values.append(value.strip())
    return values


class Protection:
    def __init__(
        self,
        app: ASGIApp,
        hosts: set[str],
        *,
        origins: set[str] | None = None,
        max_body: int = MAX_BODY_BYTES,
        check_host: bool = True,
        tokens: CsrfTokens | None = None,
    ) -> None:
        # The runner listener checks neither host nor CSRF (no TOKENS): its callers are
        # other hosts with bearer tokens and no cookies, so there is no browser to forge
        # a request for them.
        self.check_host, self.tokens = check_host, tokens
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
            await refuse(
                send,
                421,
                "forbidden_host",
                "this server answers only to its own address; behind a reverse proxy, or "
                "bound to a wildcard address, name the address clients use with "
                "--public-origin",
            )
            return
        if scope["method"] not in SAFE_METHODS:
            why = self._mutation_refused(headers) if self.tokens is not None else None
            if why is not None:
                await refuse(send, 403, why[0], why[1])
                return
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                length = self.max_body + 1
            bounded = None if length > self.max_body else await self._bounded(receive)
            if bounded is None:
                await refuse(send, 413, "too_large", f"bodies are at most {self.max_body} bytes")
                return
            receive = bounded
        await self.app(scope, receive, _nosniff(send))

    def _mutation_refused(self, headers: dict[str, str]) -> tuple[str, str] | None:
        origin = headers.get("origin")
        if origin is not None and origin not in self.origins:
            return "forbidden_origin", f"requests from {origin[:100]} are not accepted"
        cookies = cookie_values(headers.get("cookie", ""), CSRF_COOKIE)
        token = headers.get(CSRF_HEADER, "").encode()
        tokens = self.tokens
        assert tokens is not None
        if not token or not any(
            tokens.valid(c) and hmac.compare_digest(c.encode(), token) for c in cookies
        ):
            return "csrf", (
                "a change needs the CSRF token this server issued at GET /api/v1/session, "
                f"in the {CSRF_COOKIE} cookie and the X-CSRF-Token header"
            )
        return None

    async def _bounded(self, receive: Receive) -> Receive | None:
        """The body read whole (a body sent in chunks, or with an untruthful length, is
        bounded as it comes), replayed to the app; None when it is past the bound."""
        body, message = bytearray(), await receive()  # appended in place: no copy a piece
        while message["type"] == "http.request":
            body += message.get("body", b"")
            if len(body) > self.max_body:
                return None
            if not message.get("more_body", False):
                break
            message = await receive()
        whole: list[Message] = [{"type": "http.request", "body": bytes(body), "more_body": False}]
        if message["type"] != "http.request":  # the client went away meanwhile
            whole = [message]

        async def replay() -> Message:
            return whole.pop() if whole else await receive()

        return replay


def _nosniff(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            if not any(k.lower() == b"x-content-type-options" for k, _ in headers):
                headers.append((b"x-content-type-options", b"nosniff"))
            message = {**message, "headers": headers}
        await send(message)

    return sending
