"""Sandbox API: collaborators, assignees, one label, repository listings, issue search."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from aiworker.sandbox.api_issues import parse_time
from aiworker.sandbox.api_repos import page
from aiworker.sandbox.http import HttpError, Reply, Request, number
from aiworker.sandbox.scopes import KNOWN

if TYPE_CHECKING:
    from aiworker.sandbox.app import SandboxApp

TRUE = ("true", "1")


def register(app: SandboxApp) -> None:  # noqa: PLR0915 - one route table
    route, state, render = app.tools()

    @route("GET", "/repos/{owner}/{repo}/collaborators")
    def collaborators(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        if req.user is None:
            raise HttpError(401, "token required")
        return page(app, req, [render.user(login) for login in sorted(found["collaborators"])])

    @route("GET", "/repos/{owner}/{repo}/collaborators/{user}")
    def is_collaborator(req: Request, owner: str, repo: str, user: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        if req.user is None:
            raise HttpError(401, "token required")
        if state.user(user) is None:
            raise HttpError(422, "user does not exist")
        return Reply(204 if user in found["collaborators"] else 404)

    @route("DELETE", "/repos/{owner}/{repo}/collaborators/{user}")
    def remove_collaborator(req: Request, owner: str, repo: str, user: str) -> Reply:
        found = app.repo_for(req, owner, repo, "admin")
        if state.user(user) is None:
            raise HttpError(422, "user does not exist")
        found["collaborators"].pop(user, None)
        state.save()
        return Reply(204)

    @route("GET", "/repos/{owner}/{repo}/assignees")
    def assignees(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        if req.user is None:
            raise HttpError(401, "token required")
        writers = [c for c in found["collaborators"] if state.can(found, c, "write")]
        logins = [found["owner"], *sorted(writers)]
        return Reply(200, [render.user(login) for login in logins if state.user(login)])

    @route("GET", "/repos/{owner}/{repo}/labels/{ident}")
    def one_label(req: Request, owner: str, repo: str, ident: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        wanted = number(ident)
        label = state.label(found, wanted) if wanted is not None else None
        if label is None:
            raise HttpError(404, "label not found")
        return Reply(200, render.label(found, label))

    def visible(login: str | None) -> list[dict[str, Any]]:
        repos = state.data["repos"].values()
        return [r for r in sorted(repos, key=lambda r: r["id"]) if state.can(r, login, "read")]

    @route("GET", "/user/repos")
    def my_repos(req: Request) -> Reply:
        if req.user is None:
            raise HttpError(401, "token required")
        mine = [r for r in visible(req.user) if req.user in (r["owner"], *r["collaborators"])]
        return page(app, req, [render.repository(r, req.user) for r in mine])

    @route("GET", "/users/{username}/repos")
    def user_repos(req: Request, username: str) -> Reply:
        if state.user(username) is None:
            raise HttpError(404, "user not found")
        owned = [r for r in visible(req.user) if r["owner"] == username]
        return page(app, req, [render.repository(r, req.user) for r in owned])

    @route("GET", "/repos/issues/search")
    def search(req: Request) -> Reply:
        wanted = req.arg("state", "open")
        kind = req.arg("type")
        text = (req.arg("q") or "").casefold()
        labels = {n for n in (req.arg("labels") or "").split(",") if n}
        owner = req.arg("owner")
        since, before = (req.arg(n) for n in ("since", "before"))
        since = parse_time(since, "since") if since else None
        before = parse_time(before, "before") if before else None
        mine = {n for n in ("assigned", "created") if req.arg(n, "false") in TRUE}
        if mine and req.user is None:
            raise HttpError(401, "token required")
        rows = []
        for repo in visible(req.user):
            if owner and repo["owner"] != owner:
                continue
            names = {lb["id"]: lb["name"] for lb in repo["labels"]}
            for issue in repo["issues"]:
                if wanted != "all" and issue["state"] != wanted:
                    continue
                if (kind == "issues" and issue["pull"]) or (kind == "pulls" and not issue["pull"]):
                    continue
                if text and text not in (issue["title"] + "\n" + issue["body"]).casefold():
                    continue
                if labels and not labels & {names.get(i) for i in issue["labels"]}:
                    continue
                if (since and issue["updated_at"] < since) or (
                    before and issue["updated_at"] > before
                ):
                    continue
                if "assigned" in mine and req.user not in issue["assignees"]:
                    continue
                if "created" in mine and issue["user"] != req.user:
                    continue
                rows.append((issue["updated_at"], issue["id"], repo, issue))
        rows.sort(key=lambda row: (row[0], row[1]), reverse=True)
        return page(app, req, [render.issue(repo, issue) for _, _, repo, issue in rows])

    @route("GET", "/repos/{owner}/{repo}/issues/comments")
    def repo_comments(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        since, before = (req.arg(n) for n in ("since", "before"))
        since = parse_time(since, "since") if since else None
        before = parse_time(before, "before") if before else None
        rows = [
            (comment, issue)
            for issue in found["issues"]
            for comment in issue["comments"]
            if not (since and comment["updated_at"] < since)
            and not (before and comment["updated_at"] > before)
        ]
        rows.sort(key=lambda row: row[0]["id"])
        return page(app, req, [render.comment(found, issue, c) for c, issue in rows])

    @route("POST", "/users/{username}/tokens")
    def create_token(req: Request, username: str) -> Reply:
        """A token of USERNAME holding the scopes asked for (scopes.py); Forgejo takes
        basic authentication with the password here, the sandbox the user's token."""
        if req.user != username:
            raise HttpError(401, "auth required")
        body = req.json()
        name, scopes = str(body.get("name") or ""), body.get("scopes") or []
        if not name or not isinstance(scopes, list) or not set(scopes) <= KNOWN:
            raise HttpError(422, f"a name and scopes among {sorted(KNOWN)} are required")
        token = secrets.token_hex(20)
        with state.lock:
            held = {"login": username, "name": name, "scopes": sorted(scopes)}
            state.data.setdefault("tokens", {})[token] = held
            state.save()
        made = {"id": len(state.data["tokens"]), "name": name, "sha1": token}
        return Reply(201, {**made, "token_last_eight": token[-8:], "scopes": sorted(scopes)})
