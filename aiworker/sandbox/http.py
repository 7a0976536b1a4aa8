"""HTTP plumbing of the sandbox forge: requests, replies, routing, auth, pagination."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode

MAX_BODY = 64 * 1024 * 1024


class HttpError(Exception):
    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class GoFields(dict[str, Any]):
    """A decoded JSON object read as Go's encoding/json fills a struct: a field's exact
    name first, then any spelling that differs only in case (a client sending `do` for
    `Do` is understood by Forgejo)."""

    def _name(self, key: str) -> str | None:
        if dict.__contains__(self, key):
            return key
        folded = key.casefold()
        return next((name for name in self if name.casefold() == folded), None)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._name(key) is not None

    def __getitem__(self, key: str) -> Any:
        name = self._name(key)
        if name is None:
            raise KeyError(key)
        return dict.__getitem__(self, name)

    def get(self, key: str, default: Any = None) -> Any:
        name = self._name(key)
        return default if name is None else dict.__getitem__(self, name)


@dataclass
class Request:
    method: str
    path: str
    raw_query: str
    headers: dict[str, str]
    body: bytes
    user: str | None = None
    scopes: list[str] = field(default_factory=lambda: ["all"])  # the token's (scopes.py)
    query: dict[str, list[str]] = field(default_factory=dict)

    def json(self) -> GoFields:
        if not self.body:
            return GoFields()
        try:
            value = json.loads(self.body)
        except json.JSONDecodeError:
            raise HttpError(400, "request body is not valid JSON") from None
        if not isinstance(value, dict):
            raise HttpError(422, "request body must be a JSON object")
        return GoFields(value)

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        if values and "\0" in values[0]:
            raise HttpError(422, f"{name} must not contain a NUL byte")
        return values[0] if values else default

    def int_arg(self, name: str, default: int) -> int:
        value = self.arg(name)
        if value is None or value == "":
            return default
        try:
            return int(value)
        except ValueError:
            raise HttpError(422, f"{name} must be an integer") from None


@dataclass
class Reply:
    status: int
    payload: Any = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    raw: bytes | None = None

    def encode(self) -> bytes:
        if self.raw is not None:
            return self.raw
        if self.payload is None:
            return b""
        return json.dumps(self.payload).encode()


Handler = Callable[..., Reply]


def number(text: str) -> int | None:
    """TEXT as an index or id when it is plain ASCII digits ("²" is a digit to Python)."""
    return int(text) if text.isascii() and text.isdigit() else None


class Router:
    def __init__(self) -> None:
        self.routes: list[tuple[str, re.Pattern[str], Handler, int]] = []

    def add(self, method: str, pattern: str) -> Callable[[Handler], Handler]:
        literal = len(re.sub(r"\{[^}]+\}", "", pattern))
        pieces = re.split(r"(\{\w+(?:\.\.\.)?\})", pattern)
        regex = re.compile(
            "^"
            + "".join(
                f"(?P<{piece.strip('{}.')}>{'.+' if piece.endswith('...}') else '[^/]+'})"
                if piece.startswith("{")
                else re.escape(piece)
                for piece in pieces
            )
            + "$"
        )

        def register(handler: Handler) -> Handler:
            # The most literal pattern wins, as in Forgejo's router: `/repos/issues/search`
            # is not the repository `issues/search`, `/issues/comments` is not issue "comments".
            self.routes.append((method, regex, handler, literal))
            self.routes.sort(key=lambda row: -row[3])
            return handler

        return register

    def match(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        """The handler for PATH and its parameters, each percent-decoded (`feat%2Fy` is the
        branch `feat/y`); the path is matched before decoding, so an encoded slash never
        splits a segment."""
        allowed = False
        for verb, regex, handler, _literal in self.routes:
            found = regex.match(path)
            if found:
                if verb == method:
                    params = {k: unquote(v) for k, v in found.groupdict().items()}
                    if any("\0" in v for v in params.values()):
                        raise HttpError(404, "not found")
                    return handler, params
                allowed = True
        raise HttpError(
            405 if allowed else 404, "not found" if not allowed else "method not allowed"
        )


def credentials(headers: dict[str, str]) -> str | None:
    """The token a request carries: `token X`, `Bearer X`, or basic auth (token as password)."""
    value = headers.get("authorization", "").strip()
    if not value:
        return None
    scheme, _, rest = value.partition(" ")
    scheme = scheme.lower()
    if scheme in ("token", "bearer"):
        return rest.strip()
    if scheme == "basic":
        try:
            user, _, password = base64.b64decode(rest.strip()).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        if password in ("", "x-oauth-basic"):
            return user
        return password
    return None


def parse_query(raw: str) -> dict[str, list[str]]:
    return parse_qs(raw, keep_blank_values=True)


def paginate(
    req: Request, items: list[Any], root_url: str, *, default: int, maximum: int
) -> tuple[list[Any], list[tuple[str, str]]]:
    """One page of ITEMS with Forgejo's Link and X-Total-Count headers."""
    limit = req.int_arg("limit", default)
    limit = default if limit <= 0 else min(limit, maximum)
    page = max(req.int_arg("page", 1), 1)
    total = len(items)
    chunk = items[(page - 1) * limit : page * limit]
    last = max((total + limit - 1) // limit, 1)
    headers = [("X-Total-Count", str(total))]
    links = []

    def url(number: int) -> str:
        query = {k: v for k, v in req.query.items() if k != "page"}
        query["page"] = [str(number)]
        return f"{root_url.rstrip('/')}{req.path}?{urlencode(query, doseq=True)}"

    if page < last:
        links.append(f'<{url(page + 1)}>; rel="next"')
        links.append(f'<{url(last)}>; rel="last"')
    if page > 1:
        links.append(f'<{url(1)}>; rel="first"')
        links.append(f'<{url(page - 1)}>; rel="prev"')
    if links:
        headers.append(("Link", ", ".join(links)))
    return chunk, headers
