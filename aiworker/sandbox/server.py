"""The sandbox forge server: a threading HTTP server on loopback."""

from __future__ import annotations

import json
import re
import socket
import threading
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from aiworker.sandbox.gitrepo import BareRepo, GitFailed, http_backend
from aiworker.sandbox.http import (
    MAX_BODY,
    HttpError,
    Reply,
    Request,
    Router,
    credentials,
    number,
    parse_query,
)
from aiworker.sandbox.pushes import record_pushes
from aiworker.sandbox.render import Renderer
from aiworker.sandbox.state import ForgeState

LOOPBACK = ("127.0.0.1", "::1", "localhost")
GIT_PATH = "/{owner}/{repo}.git/"
SETTINGS = {"default_paging_num": 30, "max_response_items": 50}


class SandboxApp:
    def __init__(self, data_dir: Path, root_url: str) -> None:
        self.state = ForgeState(data_dir)
        self.root_url = root_url.rstrip("/") + "/"
        self.render = Renderer(self.state, self.root_url)
        self.git_root = data_dir / "git"
        self.router = Router()
        self.api_calls: Counter[str] = Counter()  # "METHOD /path": what tests count
        from aiworker.sandbox import (
            api_code,
            api_issues,
            api_people,
            api_pull_code,
            api_pulls,
            api_repos,
            api_reviews,
        )

        for module in (api_repos, api_code, api_people, api_issues):
            module.register(self)
        for module in (api_pulls, api_pull_code, api_reviews):
            module.register(self)

    def git(self, repo: dict[str, Any]) -> BareRepo:
        return BareRepo(self.git_root / repo["owner"] / f"{repo['name']}.git")

    def repo_for(self, req: Request, owner: str, name: str, needed: str = "read") -> dict[str, Any]:
        repo = self.state.repo(owner, name)
        if repo is None or not self.state.can(repo, req.user, "read"):
            raise HttpError(404, "repository not found")
        if not self.state.can(repo, req.user, needed):
            if req.user is None:
                raise HttpError(401, "token required")
            raise HttpError(403, f"user does not have {needed} permission")
        return repo

    def pull_for(
        self, req: Request, owner: str, name: str, index: str, needed: str = "read"
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        repo = self.repo_for(req, owner, name, needed)
        found = number(index)
        issue = self.state.issue(repo, found) if found is not None else None
        if issue is None or not issue["pull"]:
            raise HttpError(404, "pull request not found")
        return repo, issue

    def handle(self, req: Request) -> Reply:
        token = credentials(req.headers)
        with self.state.lock:
            self.state.refresh()
            if token is not None:
                user = self.state.user_by_token(token)
                if user is None:
                    raise HttpError(401, "invalid token")
                req.user = user["login"]
            if req.path.startswith("/api/v1/"):
                self.api_calls[f"{req.method} {req.path[len('/api/v1') :]}"] += 1
                handler, params = self.router.match(req.method, req.path[len("/api/v1") :])
                try:
                    return handler(req, **params)
                except GitFailed:
                    # A path or revision git cannot use: not there, as Forgejo answers
                    # (and never the server's own paths in the message).
                    raise HttpError(404, "not found in the repository") from None
            if req.path.startswith("/attachments/"):
                return self.download(req, req.path.rsplit("/", 1)[1])
        return self.git_http(req)

    def download(self, req: Request, uuid: str) -> Reply:
        found = self.state.data["attachments"].get(uuid)
        if found is None:
            raise HttpError(404, "attachment not found")
        self.repo_for(req, found["owner"], found["repo"])
        data = (self.state.dir / "attachments" / uuid).read_bytes()
        return Reply(200, raw=data, headers=[("Content-Type", "application/octet-stream")])

    def git_http(self, req: Request) -> Reply:
        parts = req.path.lstrip("/").split("/", 2)
        if len(parts) < 3 or not parts[1].endswith(".git"):
            raise HttpError(404, "not found")
        owner, name, rest = parts[0], parts[1][: -len(".git")], parts[2]
        pushing = rest == "git-receive-pack" or req.arg("service") == "git-receive-pack"
        with self.state.lock:
            repo = self.state.repo(owner, name)
            if repo is None:
                raise HttpError(404, "repository not found")
            needed = "write" if pushing else "read"
            if (pushing or repo["private"]) and req.user is None:
                return Reply(
                    401,
                    raw=b"authentication required\n",
                    headers=[("WWW-Authenticate", 'Basic realm="sandbox forge"')],
                )
            if not self.state.can(repo, req.user, needed):
                raise HttpError(403, f"user does not have {needed} permission")
        before = dict(self.git(repo).branches()) if rest == "git-receive-pack" else None
        status, headers, body = http_backend(
            self.git_root,
            method=req.method,
            path_info=f"/{owner}/{name}.git/{rest}",
            query=req.raw_query,
            content_type=req.headers.get("content-type", ""),
            body=req.body,
            remote_user=req.user or "anonymous",
            git_protocol=req.headers.get("git-protocol"),
        )
        if before is not None and req.user is not None:
            with self.state.lock:
                record_pushes(self.state, repo, self.git(repo), before, req.user)
        return Reply(status, raw=body, headers=headers)


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


def make_server(data_dir: Path, host: str, port: int) -> tuple[ThreadingHTTPServer, SandboxApp]:
    if host not in LOOPBACK:
        raise ValueError("the sandbox forge listens on loopback only")
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    bound_port = server.server_address[1]
    app = SandboxApp(data_dir, f"http://{host}:{bound_port}/")
    server.RequestHandlerClass = type("Handler", (_Handler,), {"app": app})
    return server, app


def serve_in_thread(data_dir: Path, port: int = 0) -> tuple[ThreadingHTTPServer, SandboxApp]:
    server, app = make_server(data_dir, "127.0.0.1", port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, app


def settings_payload() -> dict[str, int]:
    return {**SETTINGS, "default_max_blob_size": 10485760, "default_git_trees_per_page": 1000}


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()
