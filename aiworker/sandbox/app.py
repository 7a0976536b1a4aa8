"""The sandbox forge's application: its state, the API's router (the api_* modules
register their routes on it; server.py puts them together), access checks, and git's
smart HTTP."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiworker.sandbox.gitrepo import BareRepo, GitFailed, http_backend
from aiworker.sandbox.http import (
    Handler,
    HttpError,
    Reply,
    Request,
    Router,
    credentials,
    number,
)
from aiworker.sandbox.pushes import record_pushes
from aiworker.sandbox.render import Renderer
from aiworker.sandbox.scopes import categories, require
from aiworker.sandbox.state import ForgeState

Routed = Callable[[Handler], Handler]  # a route decorator
# What Forgejo refuses under an archived repository: "METHOD path below /repos/OWNER/NAME".
ARCHIVED_REFUSES = re.compile(
    r"POST (issues|issues/\d+/comments|pulls|pulls/\d+/merge|branches)"
    r"|PATCH issues/comments/\d+"
)


class SandboxApp:
    def __init__(self, data_dir: Path, root_url: str) -> None:
        self.state = ForgeState(data_dir)
        self.root_url = root_url.rstrip("/") + "/"
        self.render = Renderer(self.state, self.root_url)
        self.git_root = data_dir / "git"
        self.router = Router()
        self.api_calls: Counter[str] = Counter()  # "METHOD /path": what tests count

    def tools(self) -> tuple[Callable[[str, str], Routed], ForgeState, Renderer]:
        """What a module's route table works with: the route decorator, the forge's state
        and the renderer of its documents."""
        return self.router.add, self.state, self.render

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
                req.user, req.scopes = user["login"], user["scopes"]
            if req.path.startswith("/api/v1/"):
                path = req.path[len("/api/v1") :]
                self.api_calls[f"{req.method} {path}"] += 1
                handler, params = self.router.match(req.method, path)
                require(req.scopes, categories(path), req.method)
                self._refuse_archived(req.method, path)
                try:
                    return handler(req, **params)
                except GitFailed:
                    # A path or revision git cannot use: not there, as Forgejo answers
                    # (and never the server's own paths in the message).
                    raise HttpError(404, "not found in the repository") from None
            if req.path.startswith("/attachments/"):
                return self.download(req, req.path.rsplit("/", 1)[1])
        return self.git_http(req)

    def _refuse_archived(self, method: str, path: str) -> None:
        """423 for the changes Forgejo refuses under an archived repository (its
        mustNotBeArchived routes); it takes others, a commit status or a review among them."""
        parts = path.strip("/").split("/")
        if parts[0] != "repos" or len(parts) < 4:
            return
        repo = self.state.repo(parts[1], parts[2])
        rest = "/".join(parts[3:])
        if repo and repo.get("archived") and ARCHIVED_REFUSES.fullmatch(f"{method} {rest}"):
            raise HttpError(423, "repo is archived")

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
            require(req.scopes, ["repository"], "POST" if pushing else "GET")
            if pushing and repo.get("archived"):
                text = b"This repo is archived. You can view files and clone it, but cannot push.\n"
                return Reply(403, raw=text, headers=[("Content-Type", "text/plain")])
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
