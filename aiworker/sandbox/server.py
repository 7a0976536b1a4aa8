"""The sandbox forge server: a threading HTTP server on loopback."""

from __future__ import annotations

import json
import re
import socket
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from aiworker.sandbox import (
    api_code,
    api_issues,
    api_people,
    api_pull_code,
    api_pulls,
    api_repos,
    api_reviews,
)
from aiworker.sandbox.app import SandboxApp
from aiworker.sandbox.http import MAX_BODY, HttpError, Reply, Request, parse_query

LOOPBACK = ("127.0.0.1", "::1", "localhost")
_HEX = re.compile(rb"[0-9a-fA-F]{1,16}")


class BodyTooLarge(Exception):
    pass


def read_body(stream: Any, headers: dict[str, str]) -> bytes:
    """The request body as git and HTTP clients send it: with a Content-Length or chunked
    (git pushes over 1 MiB), and gzip-encoded (git's fetch negotiation with many refs),
    decoded here as a web server in front of Forgejo would; at most MAX_BODY bytes."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts, total = [], 0
        while True:
            line = stream.readline(1024).split(b";", 1)[0].strip()
            if not _HEX.fullmatch(line):
                raise ValueError("malformed chunk size")
            size = int(line, 16)
            if size == 0:
                while stream.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                break
            total += size
            if total > MAX_BODY:
                raise BodyTooLarge
            chunk = stream.read(size)
            if len(chunk) != size:
                raise ValueError("truncated chunk")
            parts.append(chunk)
            stream.readline(1024)  # the CRLF after each chunk
        body = b"".join(parts)
    else:
        length = int(headers.get("content-length", "0") or 0)
        if length > MAX_BODY:
            raise BodyTooLarge
        body = stream.read(length) if length else b""
    if headers.get("content-encoding", "").lower() in ("gzip", "x-gzip"):
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        body = inflate.decompress(body, MAX_BODY + 1)
        if len(body) > MAX_BODY or inflate.unconsumed_tail:
            raise BodyTooLarge
    return body


class _Handler(BaseHTTPRequestHandler):
    app: SandboxApp
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in separate writes; without this, Nagle and delayed
        # ACKs add ~40 ms to every keep-alive request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _serve(self) -> None:
        path, _, raw_query = self.path.partition("?")
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            body = read_body(self.rfile, headers)
        except BodyTooLarge:
            self._send(Reply(413, {"message": "request body too large", "url": ""}))
            self.close_connection = True
            return
        except (ValueError, zlib.error):
            self._send(Reply(400, {"message": "malformed request body", "url": ""}))
            self.close_connection = True
            return
        req = Request(self.command, path, raw_query, headers, body, query=parse_query(raw_query))
        try:
            reply = self.app.handle(req)
        except HttpError as exc:
            reply = Reply(
                exc.status, {"message": exc.message, "url": self.app.root_url + "api/swagger"}
            )
        except Exception as exc:  # the sandbox answers 500 like Forgejo
            reply = Reply(
                500, {"message": f"internal error: {type(exc).__name__}: {exc}", "url": ""}
            )
        self._send(reply)

    def _send(self, reply: Reply) -> None:
        data = reply.encode()
        self.send_response(reply.status)
        names = {name.lower() for name, _ in reply.headers}
        if "content-type" not in names:
            self.send_header("Content-Type", "application/json;charset=utf-8")
        for name, value in reply.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve


def sandbox_app(data_dir: Path, root_url: str) -> SandboxApp:
    """The application with every API module's routes."""
    app = SandboxApp(data_dir, root_url)
    for module in (api_repos, api_code, api_people, api_issues):
        module.register(app)
    for module in (api_pulls, api_pull_code, api_reviews):
        module.register(app)
    return app


def make_server(data_dir: Path, host: str, port: int) -> tuple[ThreadingHTTPServer, SandboxApp]:
    if host not in LOOPBACK:
        raise ValueError("the sandbox forge listens on loopback only")
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    bound_port = server.server_address[1]
    app = sandbox_app(data_dir, f"http://{host}:{bound_port}/")
    server.RequestHandlerClass = type("Handler", (_Handler,), {"app": app})
    return server, app


def serve_in_thread(data_dir: Path, port: int = 0) -> tuple[ThreadingHTTPServer, SandboxApp]:
    server, app = make_server(data_dir, "127.0.0.1", port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, app


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()
