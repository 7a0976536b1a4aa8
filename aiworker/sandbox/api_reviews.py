"""Sandbox API: pull request reviews, their comments, dismissals and review requests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiworker.sandbox import render_code
from aiworker.sandbox.api_repos import page
from aiworker.sandbox.http import HttpError, Reply, Request
from aiworker.sandbox.state import now_iso

if TYPE_CHECKING:
    from aiworker.sandbox.app import SandboxApp

REVIEW_EVENTS = ("APPROVED", "REQUEST_CHANGES", "COMMENT")


def register(app: SandboxApp) -> None:  # noqa: PLR0915 - one route table
    route, state, render = app.tools()

    def head_of(found: dict[str, Any], issue: dict[str, Any]) -> str:
        meta = issue["pull"]
        return str(app.git(found).branch_sha(meta["head"]) or meta["merged_head"] or "")

    def shaped(found: dict[str, Any], issue: dict[str, Any], item: dict[str, Any]) -> Any:
        return render_code.review(render, found, issue, item, head_of(found, issue))

    def visible(req: Request, item: dict[str, Any]) -> bool:
        """Another user's pending (unsubmitted) review is theirs alone."""
        return bool(item["state"] != "PENDING" or item["user"] == req.user)

    def review_for(
        req: Request, owner: str, repo: str, index: str, review_id: str, needed: str = "read"
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        found, issue = app.pull_for(req, owner, repo, index, needed)
        for item in issue["pull"]["reviews"]:
            if str(item["id"]) == review_id and visible(req, item):
                return found, issue, item
        raise HttpError(404, "review not found")

    @route("GET", "/repos/{owner}/{repo}/pulls/{index}/reviews")
    def reviews(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue = app.pull_for(req, owner, repo, index)
        items = [r for r in issue["pull"]["reviews"] if visible(req, r)]
        return page(app, req, [shaped(found, issue, r) for r in items])

    @route("POST", "/repos/{owner}/{repo}/pulls/{index}/reviews")
    def create_review(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue = app.pull_for(req, owner, repo, index)
        if req.user is None:
            raise HttpError(401, "token required")
        body = req.json()
        event = body.get("event")
        event = event if event in REVIEW_EVENTS else "PENDING"  # as Forgejo reads any other
        text = body.get("body") or ""
        if not isinstance(text, str):
            raise HttpError(422, "body must be a string")
        if event in ("APPROVED", "REQUEST_CHANGES") and issue["user"] == req.user:
            raise HttpError(
                422, "approve or request changes on your own pull request is not allowed"
            )
        comments = _review_comments(body.get("comments"))
        if event in ("REQUEST_CHANGES", "COMMENT") and not (text.strip() or comments):
            raise HttpError(422, "review body is required")
        stamp = now_iso()
        item = {
            "id": state.new_id(),
            "user": req.user,
            "state": event,
            "body": text,
            "commit_id": body.get("commit_id") or head_of(found, issue),
            "official": event in ("APPROVED", "REQUEST_CHANGES")
            and state.can(found, req.user, "write"),
            "dismissed": False,
            "submitted_at": stamp,
            "comments": [{**c, "id": state.new_id(), "created_at": stamp} for c in comments],
        }
        meta = issue["pull"]
        if event != "PENDING":  # a submitted review answers the request for it
            meta["reviews"] = [r for r in meta["reviews"] if not _request_of(r, req.user)]
            meta["requested"] = [r for r in meta.get("requested", []) if r != req.user]
        meta["reviews"].append(item)
        if event != "PENDING":
            state.record(issue, "review", req.user, body=text, review_id=item["id"])
        state.changed(issue)
        return Reply(200, shaped(found, issue, item))

    @route("GET", "/repos/{owner}/{repo}/pulls/{index}/reviews/{review_id}")
    def one_review(req: Request, owner: str, repo: str, index: str, review_id: str) -> Reply:
        found, issue, item = review_for(req, owner, repo, index, review_id)
        return Reply(200, shaped(found, issue, item))

    @route("GET", "/repos/{owner}/{repo}/pulls/{index}/reviews/{review_id}/comments")
    def review_comments(req: Request, owner: str, repo: str, index: str, review_id: str) -> Reply:
        found, issue, item = review_for(req, owner, repo, index, review_id)
        return Reply(
            200,
            [
                render_code.review_comment(render, found, issue, item, c)
                for c in item.get("comments", [])
            ],
        )

    def set_dismissed(
        req: Request, owner: str, repo: str, index: str, review_id: str, dismissed: bool
    ) -> Reply:
        found, issue, item = review_for(req, owner, repo, index, review_id, "admin")
        if item["state"] not in ("APPROVED", "REQUEST_CHANGES"):
            raise HttpError(403, "only an approval or a change request can be dismissed")
        if issue["state"] != "open":
            raise HttpError(403, "the pull request is closed")
        message = req.json().get("message") or ""
        if not isinstance(message, str):
            raise HttpError(422, "message must be a string")
        assert req.user is not None
        if item.get("dismissed", False) != dismissed:
            item["dismissed"] = dismissed
            if dismissed:
                state.record(issue, "dismiss_review", req.user, body=message, review_id=item["id"])
            state.changed(issue)
        return Reply(200, shaped(found, issue, item))

    @route("POST", "/repos/{owner}/{repo}/pulls/{index}/reviews/{review_id}/dismissals")
    def dismiss(req: Request, owner: str, repo: str, index: str, review_id: str) -> Reply:
        return set_dismissed(req, owner, repo, index, review_id, True)

    @route("POST", "/repos/{owner}/{repo}/pulls/{index}/reviews/{review_id}/undismissals")
    def undismiss(req: Request, owner: str, repo: str, index: str, review_id: str) -> Reply:
        return set_dismissed(req, owner, repo, index, review_id, False)

    def requested_logins(req: Request, found: dict[str, Any]) -> list[str]:
        wanted = req.json().get("reviewers")
        if not isinstance(wanted, list) or not all(isinstance(w, str) for w in wanted):
            raise HttpError(422, "reviewers must be a list of user names")
        for login in wanted:
            if state.user(login) is None:
                raise HttpError(404, f"user {login!r} does not exist")
            if not state.can(found, login, "read"):
                raise HttpError(422, f"{login} cannot read this repository")
        return list(dict.fromkeys(wanted))

    def requester(req: Request, owner: str, repo: str, index: str) -> tuple[Any, Any, str]:
        """The author or a writer may change an open pull request's review requests."""
        found, issue = app.pull_for(req, owner, repo, index)
        if req.user is None:
            raise HttpError(401, "token required")
        if req.user != issue["user"] and not state.can(found, req.user, "write"):
            raise HttpError(403, "user may not change review requests")
        if issue["state"] != "open":
            raise HttpError(403, "the pull request is closed")
        return found, issue, req.user

    @route("POST", "/repos/{owner}/{repo}/pulls/{index}/requested_reviewers")
    def request_reviews(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue, user = requester(req, owner, repo, index)
        requested = issue["pull"].setdefault("requested", [])
        created = []
        for login in requested_logins(req, found):
            if login == issue["user"]:
                raise HttpError(422, "the author of a pull request cannot review it")
            if login in requested:
                continue
            requested.append(login)
            state.record(issue, "review_request", user, assignee=login)
            item = {
                "id": state.new_id(),
                "user": login,
                "state": "REQUEST_REVIEW",
                "body": "",
                "commit_id": "",
                "official": False,
                "dismissed": False,
                "submitted_at": now_iso(),
                "comments": [],
            }
            issue["pull"]["reviews"].append(item)
            created.append(shaped(found, issue, item))
        state.changed(issue)
        return Reply(201, created)

    @route("DELETE", "/repos/{owner}/{repo}/pulls/{index}/requested_reviewers")
    def cancel_requests(req: Request, owner: str, repo: str, index: str) -> Reply:
        found, issue, user = requester(req, owner, repo, index)
        meta = issue["pull"]
        requested = meta.setdefault("requested", [])
        for login in requested_logins(req, found):
            if login in requested:
                requested.remove(login)
                meta["reviews"] = [r for r in meta["reviews"] if not _request_of(r, login)]
                state.record(issue, "review_request", user, assignee=login, removed=True)
        state.changed(issue)
        return Reply(204)


def _request_of(review: dict[str, Any], login: str) -> bool:
    return bool(review["state"] == "REQUEST_REVIEW" and review["user"] == login)


def _review_comments(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise HttpError(422, "comments must be a list")
    comments = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise HttpError(422, "each review comment needs a path")
        if not isinstance(entry.get("body"), str) or not entry["body"]:
            raise HttpError(422, "each review comment needs a body")
        lines = [entry.get(k, 0) or 0 for k in ("new_position", "old_position")]
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in lines):
            raise HttpError(422, "review comment positions are non-negative integers")
        comments.append(
            {"path": entry["path"], "body": entry["body"], "new": lines[0], "old": lines[1]}
        )
    return comments
