"""Sandbox API: instance, user, repository, labels, collaborators, branches, refs, statuses."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from aiworker.sandbox import render_code
from aiworker.sandbox.http import HttpError, Reply, Request, paginate
from aiworker.sandbox.settings import SETTINGS, settings_payload
from aiworker.sandbox.state import now_iso

if TYPE_CHECKING:
    from aiworker.sandbox.app import SandboxApp

VERSION = "15.0.3+gitea-1.22.0"
_COLOR = re.compile(r"^#?[0-9a-fA-F]{6}$")
STATUS_STATES = ("pending", "success", "error", "failure", "warning")


def page(app: SandboxApp, req: Request, items: list[Any]) -> Reply:
    chunk, headers = paginate(
        req,
        items,
        app.root_url,
        default=SETTINGS["default_paging_num"],
        maximum=SETTINGS["max_response_items"],
    )
    return Reply(200, chunk, headers)


def register(app: SandboxApp) -> None:  # noqa: PLR0915 - one route table
    route, state, render = app.tools()

    @route("GET", "/version")
    def version(_req: Request) -> Reply:
        return Reply(200, {"version": VERSION})

    @route("GET", "/settings/api")
    def settings(_req: Request) -> Reply:
        return Reply(200, settings_payload())

    @route("GET", "/user")
    def current_user(req: Request) -> Reply:
        if req.user is None:
            raise HttpError(401, "token required")
        return Reply(200, render.user(req.user))

    @route("GET", "/repos/{owner}/{repo}")
    def repository(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        return Reply(200, render.repository(found, req.user))

    @route("PATCH", "/repos/{owner}/{repo}")
    def edit_repository(req: Request, owner: str, repo: str) -> Reply:
        """Archive or unarchive it (the one edit the sandbox takes), as a repository admin."""
        found = app.repo_for(req, owner, repo, "admin")
        archived = req.json().get("archived")
        if archived is not None:
            found["archived"] = bool(archived)
            state.save()
        return Reply(200, render.repository(found, req.user))

    @route("GET", "/repos/{owner}/{repo}/labels")
    def labels(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        return page(app, req, [render.label(found, lb) for lb in found["labels"]])

    @route("POST", "/repos/{owner}/{repo}/labels")
    def create_label(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo, "write")
        body = req.json()
        name, color = body.get("name"), body.get("color", "")
        if not isinstance(name, str) or not name or not _COLOR.match(str(color)):
            raise HttpError(422, "name and a #rrggbb color are required")
        if state.label(found, name) is not None:
            raise HttpError(409, "label already exists")
        label = {
            "id": state.new_id(),
            "name": name,
            "color": str(color).lstrip("#"),
            "description": body.get("description", ""),
        }
        found["labels"].append(label)
        state.save()
        return Reply(201, render.label(found, label))

    @route("GET", "/repos/{owner}/{repo}/collaborators/{user}/permission")
    def permission(req: Request, owner: str, repo: str, user: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        if req.user is None:
            raise HttpError(401, "token required")
        caller = state.permission(found, req.user)
        if req.user != user and caller not in ("admin", "owner"):
            raise HttpError(403, "only repository admins may read other users' permissions")
        if state.user(user) is None:
            raise HttpError(404, "user not found")
        mode = state.permission(found, user)
        return Reply(200, {"permission": mode, "role_name": mode, "user": render.user(user)})

    @route("PUT", "/repos/{owner}/{repo}/collaborators/{user}")
    def add_collaborator(req: Request, owner: str, repo: str, user: str) -> Reply:
        found = app.repo_for(req, owner, repo, "admin")
        if state.user(user) is None:
            raise HttpError(422, "user does not exist")
        mode = req.json().get("permission") or "write"
        if mode not in ("read", "write", "admin"):
            raise HttpError(422, "permission must be read, write or admin")
        found["collaborators"][user] = mode
        state.save()
        return Reply(204)

    @route("DELETE", "/repos/{owner}/{repo}/collaborators/{user}")
    def remove_collaborator(req: Request, owner: str, repo: str, user: str) -> Reply:
        found = app.repo_for(req, owner, repo, "admin")
        if state.user(user) is None:
            raise HttpError(404, "user does not exist")
        found["collaborators"].pop(user, None)  # not one: Forgejo answers 204 all the same
        state.save()
        return Reply(204)

    @route("GET", "/repos/{owner}/{repo}/branches")
    def branches(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        git = app.git(found)
        rows = [
            render_code.branch(render, found, git, name, sha, req.user)
            for name, sha in git.branches()
        ]
        return page(app, req, rows)

    @route("GET", "/repos/{owner}/{repo}/branches/{branch...}")
    def branch(req: Request, owner: str, repo: str, branch: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        git = app.git(found)
        sha = git.branch_sha(branch)
        if sha is None:
            raise HttpError(404, "branch not found")
        return Reply(200, render_code.branch(render, found, git, branch, sha, req.user))

    @route("POST", "/repos/{owner}/{repo}/branches")
    def create_branch(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo, "write")
        body = req.json()
        name = body.get("new_branch_name")
        if not isinstance(name, str) or not name:
            raise HttpError(422, "new_branch_name is required")
        git = app.git(found)
        start = body.get("old_ref_name") or body.get("old_branch_name") or found["default_branch"]
        sha = git.branch_sha(start) or git.resolve(start)
        if sha is None:
            raise HttpError(404, "old ref not found")
        if git.branch_sha(name) is not None:
            raise HttpError(409, "branch already exists")
        git.update_ref(name, sha, None)
        return Reply(201, render_code.branch(render, found, git, name, sha, req.user))

    def refs_reply(req: Request, owner: str, repo: str, prefix: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        rows = [
            {
                "ref": ref,
                "url": f"{app.root_url}api/v1/repos/{owner}/{repo}/git/{ref}",
                "object": {
                    "sha": sha,
                    "type": kind,
                    "url": f"{app.root_url}api/v1/repos/{owner}/{repo}/git/{kind}s/{sha}",
                },
            }
            for ref, sha, kind in app.git(found).refs(prefix)
        ]
        if not rows:
            raise HttpError(404, "reference not found")
        return Reply(200, rows)

    @route("GET", "/repos/{owner}/{repo}/git/refs")
    def all_refs(req: Request, owner: str, repo: str) -> Reply:
        return refs_reply(req, owner, repo, "refs/")

    @route("GET", "/repos/{owner}/{repo}/git/refs/{ref...}")
    def some_refs(req: Request, owner: str, repo: str, ref: str) -> Reply:
        return refs_reply(req, owner, repo, "refs/" + ref)

    @route("POST", "/repos/{owner}/{repo}/statuses/{sha}")
    def create_status(req: Request, owner: str, repo: str, sha: str) -> Reply:
        found = app.repo_for(req, owner, repo, "write")
        body = req.json()
        if body.get("state") not in STATUS_STATES:
            raise HttpError(422, f"state must be one of {', '.join(STATUS_STATES)}")
        full = app.git(found).resolve(sha)
        if full is None:
            raise HttpError(404, "commit not found")
        item = {
            "id": state.new_id(),
            "sha": full,
            "state": body["state"],
            "context": body.get("context") or "default",
            "description": body.get("description") or "",
            "target_url": body.get("target_url") or "",
            "creator": req.user,
            "created_at": now_iso(),
        }
        found["statuses"].setdefault(full, []).append(item)
        state.save()
        return Reply(201, render_code.status(render, found, item))

    @route("GET", "/repos/{owner}/{repo}/commits/{ref...}/status")
    def combined(req: Request, owner: str, repo: str, ref: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        git = app.git(found)
        sha = git.branch_sha(ref) or git.resolve(ref)
        if sha is None:
            raise HttpError(404, "ref not found")
        latest = render_code.latest_per_context(found["statuses"].get(sha, []))
        return Reply(
            200,
            {
                "state": render_code.combined_state(latest),
                "sha": sha,
                "total_count": len(latest),
                "statuses": [render_code.status(render, found, i) for i in latest],
                "repository": render.repository(found, req.user),
                "commit_url": f"{app.root_url}api/v1/repos/{owner}/{repo}/git/commits/{sha}",
                "url": f"{app.root_url}api/v1/repos/{owner}/{repo}/commits/{sha}/status",
            },
        )
