"""Sandbox API: pull requests, merging and reviews."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from aiworker.sandbox import render_code
from aiworker.sandbox.api_issues import creation_fields
from aiworker.sandbox.api_repos import page
from aiworker.sandbox.http import HttpError, Reply, Request
from aiworker.sandbox.merge import STYLES, MergeConflict, MergeNotPossible, merge_pull
from aiworker.sandbox.protection import merge_refusal, rule_for
from aiworker.sandbox.state import ForgeState, now_iso

if TYPE_CHECKING:
    from aiworker.sandbox.app import SandboxApp


def register(app: SandboxApp) -> None:  # noqa: PLR0915 - one route table
    route, state, render = app.tools()

    pull_for = app.pull_for

    def shaped(found: dict[str, Any], issue: dict[str, Any], req: Request) -> dict[str, Any]:
        return render_code.pull(render, found, issue, app.git(found), req.user)

    @route("GET", "/repos/{owner}/{repo}/pulls")
    def list_pulls(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        wanted = req.arg("state", "open")
        rows = [
            shaped(found, i, req)
            for i in sorted(found["issues"], key=lambda i: i["number"], reverse=True)
            if i["pull"] and (wanted == "all" or i["state"] == wanted)
        ]
        return page(app, req, rows)

    @route("POST", "/repos/{owner}/{repo}/pulls")
    def create_pull(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo, "write")
        assert req.user is not None
        body = req.json()
        head, base, title = (str(body.get(k) or "") for k in ("head", "base", "title"))
        if not (head and base and title):
            raise HttpError(422, "head, base and title are required")
        git = app.git(found)
        head_sha, base_sha = git.branch_sha(head), git.branch_sha(base)
        if head_sha is None or base_sha is None:
            raise HttpError(404, "head or base branch does not exist")
        if head == base:
            raise HttpError(422, "head and base must differ")
        for issue in found["issues"]:
            meta = issue["pull"]
            if meta and issue["state"] == "open" and meta["head"] == head and meta["base"] == base:
                raise HttpError(
                    409, f"pull request already exists for these targets: #{issue['number']}"
                )
        if git.is_ancestor(head_sha, base_sha):
            raise HttpError(422, "there are no changes between the head and the base")
        text, labels, assignees = creation_fields(body)
        issue = state.add_issue(found, req.user, title, text)
        issue["pull"] = {
            "head": head,
            "base": base,
            "merged": False,
            "merged_at": None,
            "merged_by": None,
            "merge_commit_sha": None,
            "merged_head": None,
            "reviews": [],
        }
        state.give_at_creation(found, issue, req.user, labels, assignees)
        state.save()
        return Reply(201, shaped(found, issue, req))

    @route("GET", "/repos/{owner}/{repo}/pulls/{index}")
    def get_pull(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue = pull_for(req, owner, repo, index)
        return Reply(200, shaped(found, issue, req))

    @route("PATCH", "/repos/{owner}/{repo}/pulls/{index}")
    def edit_pull(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue = pull_for(req, owner, repo, index)
        if not state.can(found, req.user, "write") and issue["user"] != req.user:
            raise HttpError(403, "user may not edit this pull request")
        body = req.json()
        title = body.get("title")
        if isinstance(title, str) and title.strip() and title != issue["title"]:
            assert req.user is not None
            state.record(issue, "change_title", req.user, old_title=issue["title"], new_title=title)
            issue["title"] = title
        if isinstance(body.get("body"), str):
            issue["body"] = body["body"]
        if body.get("state") in ("open", "closed") and not issue["pull"]["merged"]:
            issue["state"] = body["state"]
            issue["closed_at"] = now_iso() if body["state"] == "closed" else None
        if isinstance(body.get("base"), str) and body["base"]:
            if app.git(found).branch_sha(body["base"]) is None:
                raise HttpError(404, "base branch does not exist")
            issue["pull"]["base"] = body["base"]
        state.changed(issue)
        return Reply(201, shaped(found, issue, req))

    @route("GET", "/repos/{owner}/{repo}/pulls/{index}/merge")
    def is_merged(req: Request, owner: str, repo: str, index: str) -> Reply:
        _found, issue = pull_for(req, owner, repo, index)
        return Reply(204 if issue["pull"]["merged"] else 404)

    @route("POST", "/repos/{owner}/{repo}/pulls/{index}/merge")
    def merge(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue = pull_for(req, owner, repo, index, "write")
        assert req.user is not None
        body = req.json()
        style = body.get("Do")
        if style not in STYLES:
            raise HttpError(422, f"Do must be one of {', '.join(STYLES)}")
        meta = issue["pull"]
        if meta["merged"]:
            raise HttpError(405, "pull request has already been merged")
        if issue["state"] != "open":
            raise HttpError(405, "pull request is closed")
        git = app.git(found)
        head_sha = git.branch_sha(meta["head"])
        if head_sha is None:
            raise HttpError(405, "head branch no longer exists")
        guard = body.get("head_commit_id")
        if guard and guard != head_sha:
            raise HttpError(409, "head commit has changed")
        refusal = merge_refusal(found, issue, head_sha)
        if refusal and style != "manually-merged":
            raise HttpError(405, f"not allowed to merge: {refusal}")
        meta["merge_base"] = git.merge_base(git.branch_sha(meta["base"]) or "", head_sha)
        if style == "manually-merged":
            merged_sha = body.get("MergeCommitID") or head_sha
        else:
            title = body.get("MergeTitleField")
            message = "\n\n".join(p for p in (title, body.get("MergeMessageField")) if p) or None
            try:
                merged_sha = merge_pull(
                    git,
                    base=meta["base"],
                    head_sha=head_sha,
                    head_branch=meta["head"],
                    style=style,
                    number=issue["number"],
                    title=issue["title"],
                    merger=req.user,
                    message=message,
                )
            except MergeConflict as exc:
                raise HttpError(409, f"merge failed because of conflict: {exc}") from None
            except MergeNotPossible as exc:
                raise HttpError(405, str(exc)) from None
        stamp = now_iso()
        meta.update(
            merged=True,
            merged_at=stamp,
            merged_by=req.user,
            merge_commit_sha=merged_sha,
            merged_head=head_sha,
        )
        issue["state"] = "closed"
        issue["closed_at"] = stamp
        state.record(issue, "merge_pull", req.user, ref_commit_sha=merged_sha)
        state.touch(issue)
        if meta["base"] == found["default_branch"]:
            _close_resolved(state, found, issue, req.user, merged_sha)
        deletable = rule_for(found, meta["head"]) is None
        if body.get("delete_branch_after_merge") and deletable and git.delete_branch(meta["head"]):
            state.record(issue, "delete_branch", req.user, old_ref=meta["head"])
        state.save()
        return Reply(200)


# "Resolves #3", "fixes #3", "closed #3": the issues a pull request resolves.
RESOLVES = re.compile(r"\b(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?)\s+#(\d+)\b", re.IGNORECASE)


def _close_resolved(
    state: ForgeState, repo: dict[str, Any], pull: dict[str, Any], user: str, commit: str
) -> None:
    """Close the open issues PULL's title and description resolve, as Forgejo does when
    a pull request is merged into the default branch."""
    text = f"{pull['title']}\n{pull.get('body') or ''}"
    for number in sorted({int(n) for n in RESOLVES.findall(text)}):
        issue = state.issue(repo, number)
        if issue is not None and not issue["pull"] and issue["state"] == "open":
            issue["state"], issue["closed_at"] = "closed", now_iso()
            state.record(issue, "close", user, ref_commit_sha=commit)
            state.touch(issue)
