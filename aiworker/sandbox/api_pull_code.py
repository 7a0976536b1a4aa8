"""Sandbox API: a pull request's code: by base and head, files, commits, diff, branch update."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiworker.sandbox import render_code, render_git
from aiworker.sandbox.api_repos import page
from aiworker.sandbox.http import HttpError, Reply, Request
from aiworker.sandbox.merge import MergeConflict, MergeNotPossible, update_branch
from aiworker.sandbox.pushes import record_pushes

if TYPE_CHECKING:
    from aiworker.sandbox.app import SandboxApp

UPDATE_STYLES = ("merge", "rebase")


def register(app: SandboxApp) -> None:  # noqa: PLR0915 - one route table
    route, state, render = app.tools()

    def span(found: dict[str, Any], issue: dict[str, Any]) -> tuple[str, str]:
        """The pull request's base and head commits (the merged head once merged)."""
        git, meta = app.git(found), issue["pull"]
        head = meta["merged_head"] if meta["merged"] else git.branch_sha(meta["head"])
        # Once merged, the base contains the head: compare with where they met.
        base = (meta.get("merge_base") if meta["merged"] else None) or git.branch_sha(meta["base"])
        if head is None or base is None:
            raise HttpError(404, "the pull request's head or base branch no longer exists")
        return base, head

    @route("GET", "/repos/{owner}/{repo}/pulls/{base}/{head...}")
    def by_base_head(req: Request, owner: str, repo: str, base: str, head: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        head = head.split(":", 1)[-1]  # `owner:branch` names the same repository here
        matches = [
            i
            for i in sorted(found["issues"], key=lambda i: i["number"], reverse=True)
            if i["pull"] and i["pull"]["base"] == base and i["pull"]["head"] == head
        ]
        if not matches:
            raise HttpError(404, "pull request not found")
        chosen = next((i for i in matches if i["state"] == "open"), matches[0])
        return Reply(200, render_code.pull(render, found, chosen, app.git(found), req.user))

    @route("GET", "/repos/{owner}/{repo}/pulls/{index}/files")
    def files(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue = app.pull_for(req, owner, repo, index)
        base, head = span(found, issue)
        changes = app.git(found).changes(base, head)
        return page(app, req, [render_git.changed_file(render, found, c, head) for c in changes])

    @route("GET", "/repos/{owner}/{repo}/pulls/{index}/commits")
    def commits(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue = app.pull_for(req, owner, repo, index)
        base, head = span(found, issue)
        git = app.git(found)
        want_files = req.arg("files", "true") != "false"
        rows = [
            render_git.commit(
                render,
                found,
                entry,
                git.changes(entry.parents[0], entry.sha) if want_files and entry.parents else None,
            )
            for entry in reversed(git.log(f"{base}..{head}"))
        ]
        return page(app, req, rows)

    @route("GET", "/repos/{owner}/{repo}/pulls/{index}.{kind}")
    def diff(req: Request, owner: str, repo: str, index: str, kind: str) -> Reply:
        if kind not in ("diff", "patch"):
            raise HttpError(404, "not found")
        found, issue = app.pull_for(req, owner, repo, index)
        base, head = span(found, issue)
        text = app.git(found).patch_text(base, head, as_mail=kind == "patch")
        return Reply(200, raw=text.encode(), headers=[("Content-Type", "text/plain;charset=utf-8")])

    @route("POST", "/repos/{owner}/{repo}/pulls/{index}/update")
    def update(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue = app.pull_for(req, owner, repo, index, "write")
        assert req.user is not None
        style = req.arg("style") or "merge"
        if style not in UPDATE_STYLES:
            raise HttpError(422, f"style must be one of {', '.join(UPDATE_STYLES)}")
        meta = issue["pull"]
        if meta["merged"] or issue["state"] != "open":
            raise HttpError(422, "pull request is closed or merged")
        base, head = span(found, issue)
        if app.git(found).is_ancestor(base, head):
            raise HttpError(422, "the head branch is already up to date with the base")
        before = dict(app.git(found).branches())
        try:
            update_branch(
                app.git(found), head=meta["head"], base=meta["base"], style=style, user=req.user
            )
        except MergeConflict as exc:
            raise HttpError(409, f"update failed because of conflict: {exc}") from None
        except MergeNotPossible as exc:
            raise HttpError(422, str(exc)) from None
        record_pushes(state, found, app.git(found), before, req.user)
        return Reply(200)
