"""Sandbox API: issues, comments, issue labels, attachments and the timeline."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiworker.sandbox.api_repos import page
from aiworker.sandbox.http import HttpError, Reply, Request, number
from aiworker.sandbox.state import now_iso

if TYPE_CHECKING:
    from aiworker.sandbox.app import SandboxApp

MAX_ASSET = 8 * 1024 * 1024


def parse_time(value: str, name: str) -> str:
    """An RFC 3339 time as the UTC text the store compares with."""
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise HttpError(422, f"{name} must be an RFC 3339 time") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def creation_fields(body: dict[str, Any]) -> tuple[str, list[int], list[str]]:
    """The body text, label ids and assignee logins a new issue or pull request is given,
    checked before anything is created (Go's decoder refuses wrong types: 422)."""
    text, labels = body.get("body") or "", body.get("labels") or []
    assignees = body.get("assignees") or []
    if not isinstance(assignees, list):
        raise HttpError(422, "assignees must be a list of user names")
    if body.get("assignee"):
        assignees = [*assignees, body.get("assignee")]
    if not isinstance(text, str):
        raise HttpError(422, "body must be a string")
    if not isinstance(labels, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in labels
    ):
        raise HttpError(422, "labels must be a list of label ids")
    if not all(isinstance(login, str) for login in assignees):
        raise HttpError(422, "assignees must be a list of user names")
    return text, labels, assignees


def register(app: SandboxApp) -> None:  # noqa: PLR0915 - one route table
    route, state, render = app.tools()

    def issue_for(
        req: Request, owner: str, repo: str, index: str, needed: str = "read"
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        found = app.repo_for(req, owner, repo, needed)
        wanted = number(index)
        issue = state.issue(found, wanted) if wanted is not None else None
        if issue is None:
            raise HttpError(404, "issue not found")
        return found, issue

    def login_required(req: Request) -> str:
        if req.user is None:
            raise HttpError(401, "token required")
        return req.user

    @route("GET", "/repos/{owner}/{repo}/issues")
    def list_issues(req: Request, owner: str, repo: str) -> Reply:
        found = app.repo_for(req, owner, repo)
        wanted_state = req.arg("state", "open")
        kind = req.arg("type")
        labels = {n for n in (req.arg("labels") or "").split(",") if n}
        since = req.arg("since")
        before = req.arg("before")
        since = parse_time(since, "since") if since else None
        before = parse_time(before, "before") if before else None
        assignee = req.arg("assigned_by")
        author = req.arg("created_by")
        rows = []
        for issue in sorted(found["issues"], key=lambda i: i["number"], reverse=True):
            if wanted_state != "all" and issue["state"] != wanted_state:
                continue
            if (kind == "issues" and issue["pull"]) or (kind == "pulls" and not issue["pull"]):
                continue
            names = {lb["name"] for lb in found["labels"] if lb["id"] in issue["labels"]}
            if labels and not labels & names:
                continue
            if (since and issue["updated_at"] < since) or (before and issue["updated_at"] > before):
                continue
            if assignee and assignee not in issue["assignees"]:
                continue
            if author and issue["user"] != author:
                continue
            rows.append(render.issue(found, issue))
        return page(app, req, rows)

    @route("POST", "/repos/{owner}/{repo}/issues")
    def create_issue(req: Request, owner: str, repo: str) -> Reply:
        user = login_required(req)
        found = app.repo_for(req, owner, repo)
        body = req.json()
        if not isinstance(body.get("title"), str) or not body["title"].strip():
            raise HttpError(422, "title is required")
        text, labels, assignees = creation_fields(body)
        issue = state.add_issue(found, user, body["title"], text)
        if state.can(found, user, "write"):
            state.give_at_creation(found, issue, user, labels, assignees)
        state.save()
        return Reply(201, render.issue(found, issue))

    @route("GET", "/repos/{owner}/{repo}/issues/{index}")
    def get_issue(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue = issue_for(req, owner, repo, index)
        return Reply(200, render.issue(found, issue))

    @route("PATCH", "/repos/{owner}/{repo}/issues/{index}")
    def edit_issue(req: Request, owner: str, repo: str, index: str) -> Reply:
        user = login_required(req)
        found, issue = issue_for(req, owner, repo, index)
        writer = state.can(found, user, "write")
        if not writer and issue["user"] != user:
            raise HttpError(403, "user may not edit this issue")
        body = req.json()
        title = body.get("title")
        if isinstance(title, str) and title.strip() and title != issue["title"]:
            state.record(issue, "change_title", user, old_title=issue["title"], new_title=title)
            issue["title"] = title
        if isinstance(body.get("body"), str):
            issue["body"] = body["body"]
        if body.get("state") in ("open", "closed") and body["state"] != issue["state"]:
            issue["state"] = body["state"]
            issue["closed_at"] = now_iso() if body["state"] == "closed" else None
            state.record(issue, "close" if body["state"] == "closed" else "reopen", user)
        if writer and isinstance(body.get("assignees"), list):
            new = [a for a in body["assignees"] if state.user(a)]
            for login in set(issue["assignees"]) - set(new):
                state.record(issue, "assignees", user, assignee=login, removed=True)
            for login in set(new) - set(issue["assignees"]):
                state.record(issue, "assignees", user, assignee=login)
            issue["assignees"] = new
        state.changed(issue)
        return Reply(201, render.issue(found, issue))

    @route("GET", "/repos/{owner}/{repo}/issues/{index}/comments")
    def comments(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue = issue_for(req, owner, repo, index)
        rows = [render.comment(found, issue, c) for c in issue["comments"]]
        return Reply(200, rows, [("X-Total-Count", str(len(rows)))])

    @route("POST", "/repos/{owner}/{repo}/issues/{index}/comments")
    def add_comment(req: Request, owner: str, repo: str, index: str) -> Reply:
        user = login_required(req)
        found, issue = issue_for(req, owner, repo, index)
        text = req.json().get("body")
        if not isinstance(text, str) or not text:
            raise HttpError(422, "body is required")
        stamp = now_iso()
        comment = {
            "id": state.new_id(),
            "user": user,
            "body": text,
            "created_at": stamp,
            "updated_at": stamp,
        }
        issue["comments"].append(comment)
        state.record(issue, "comment", user, body=text, id=comment["id"])
        state.changed(issue)
        return Reply(201, render.comment(found, issue, comment))

    def find_comment(
        req: Request, owner: str, repo: str, comment_id: str
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        found = app.repo_for(req, owner, repo)
        for issue in found["issues"]:
            for comment in issue["comments"]:
                if str(comment["id"]) == comment_id:
                    return found, issue, comment
        raise HttpError(404, "comment not found")

    def own_comment(
        req: Request, owner: str, repo: str, comment_id: str, verb: str
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The comment, which the caller must have written or may VERB as a writer."""
        user = login_required(req)
        found, issue, comment = find_comment(req, owner, repo, comment_id)
        if comment["user"] != user and not state.can(found, user, "write"):
            raise HttpError(403, f"user may not {verb} this comment")
        return found, issue, comment

    @route("GET", "/repos/{owner}/{repo}/issues/comments/{comment_id}")
    def get_comment(req: Request, owner: str, repo: str, comment_id: str) -> Reply:
        found, issue, comment = find_comment(req, owner, repo, comment_id)
        return Reply(200, render.comment(found, issue, comment))

    @route("PATCH", "/repos/{owner}/{repo}/issues/comments/{comment_id}")
    def edit_comment(req: Request, owner: str, repo: str, comment_id: str) -> Reply:
        found, issue, comment = own_comment(req, owner, repo, comment_id, "edit")
        text = req.json().get("body")
        if not isinstance(text, str) or not text:
            raise HttpError(422, "body is required")
        comment["body"] = text
        comment["updated_at"] = now_iso()
        for event in issue["timeline"]:
            if event["id"] == comment["id"]:
                event.update(body=text, updated_at=comment["updated_at"])
        state.save()
        return Reply(200, render.comment(found, issue, comment))

    @route("DELETE", "/repos/{owner}/{repo}/issues/comments/{comment_id}")
    def delete_comment(req: Request, owner: str, repo: str, comment_id: str) -> Reply:
        _found, issue, comment = own_comment(req, owner, repo, comment_id, "delete")
        issue["comments"].remove(comment)
        issue["timeline"] = [e for e in issue["timeline"] if e["id"] != comment["id"]]
        state.save()
        return Reply(204)

    def set_labels(issue: dict[str, Any], user: str, ids: list[int]) -> None:
        for label_id in [i for i in issue["labels"] if i not in ids]:
            issue["labels"].remove(label_id)
            state.record(issue, "label", user, label=label_id, body="")
        for label_id in [i for i in ids if i not in issue["labels"]]:
            issue["labels"].append(label_id)
            state.record(issue, "label", user, label=label_id, body="1")
        state.changed(issue)

    def labels_of(found: dict[str, Any], issue: dict[str, Any]) -> list[dict[str, Any]]:
        return [render.label(found, lb) for lb in found["labels"] if lb["id"] in issue["labels"]]

    def wanted_labels(req: Request, found: dict[str, Any]) -> list[int]:
        """The ids of the labels a request names (by id or name), each existing."""
        wanted = req.json().get("labels")
        if not isinstance(wanted, list):
            raise HttpError(422, "labels must be a list of ids or names")
        ids = []
        for ident in wanted:
            label = state.label(found, ident)
            if label is None:
                raise HttpError(422, f"label {ident!r} does not exist")
            ids.append(label["id"])
        return list(dict.fromkeys(ids))

    @route("PUT", "/repos/{owner}/{repo}/issues/{index}/labels")
    def replace_labels(req: Request, owner: str, repo: str, index: str) -> Reply:
        user = login_required(req)
        found, issue = issue_for(req, owner, repo, index, "write")
        set_labels(issue, user, wanted_labels(req, found))
        return Reply(200, labels_of(found, issue))

    @route("DELETE", "/repos/{owner}/{repo}/issues/{index}/labels")
    def clear_labels(req: Request, owner: str, repo: str, index: str) -> Reply:
        user = login_required(req)
        _found, issue = issue_for(req, owner, repo, index, "write")
        set_labels(issue, user, [])
        return Reply(204)

    @route("GET", "/repos/{owner}/{repo}/issues/{index}/labels")
    def issue_labels(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue = issue_for(req, owner, repo, index)
        return Reply(200, labels_of(found, issue))

    @route("POST", "/repos/{owner}/{repo}/issues/{index}/labels")
    def add_labels(req: Request, owner: str, repo: str, index: str) -> Reply:
        user = login_required(req)
        found, issue = issue_for(req, owner, repo, index, "write")
        added = [i for i in wanted_labels(req, found) if i not in issue["labels"]]
        set_labels(issue, user, issue["labels"] + added)
        return Reply(200, labels_of(found, issue))

    @route("DELETE", "/repos/{owner}/{repo}/issues/{index}/labels/{identifier}")
    def remove_label(req: Request, owner: str, repo: str, index: str, identifier: str) -> Reply:
        user = login_required(req)
        found, issue = issue_for(req, owner, repo, index, "write")
        label = state.label(found, identifier)
        if label is None:
            raise HttpError(422, "label does not exist")
        if label["id"] in issue["labels"]:
            issue["labels"].remove(label["id"])
            state.record(issue, "label", user, label=label["id"], body="")
            state.changed(issue)
        return Reply(204)

    @route("GET", "/repos/{owner}/{repo}/issues/{index}/assets")
    def assets(req: Request, owner: str, repo: str, index: str) -> Reply:
        _found, issue = issue_for(req, owner, repo, index)
        return Reply(200, [render.attachment(a) for a in issue["assets"]])

    @route("POST", "/repos/{owner}/{repo}/issues/{index}/assets")
    def upload(req: Request, owner: str, repo: str, index: str) -> Reply:
        login_required(req)
        _found, issue = issue_for(req, owner, repo, index)
        name = req.arg("name") or "attachment.bin"
        if len(req.body) > MAX_ASSET:
            raise HttpError(413, "attachment too large")
        ident = str(uuid.uuid4())
        folder = state.dir / "attachments"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ident).write_bytes(req.body)
        asset = {
            "id": state.new_id(),
            "uuid": ident,
            "name": name,
            "size": len(req.body),
            "created_at": now_iso(),
        }
        issue["assets"].append(asset)
        state.data["attachments"][ident] = {"owner": owner, "repo": repo}
        state.save()
        return Reply(201, render.attachment(asset))

    @route("GET", "/repos/{owner}/{repo}/issues/{index}/timeline")
    def timeline(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue = issue_for(req, owner, repo, index)
        return page(app, req, [render.timeline(found, issue, e) for e in issue["timeline"]])
