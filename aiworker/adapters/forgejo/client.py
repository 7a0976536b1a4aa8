"""Forgejo operations for one identity (planner, worker, reviewer: three instances)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, TypeVar, Unpack
from urllib.parse import urlsplit

import requests
from pydantic import BaseModel, ValidationError

from aiworker.adapters.forgejo import models as m
from aiworker.adapters.forgejo.errors import (
    ForgeAnswerLost,
    ForgeBadAnswer,
    ForgeConflict,
    ForgeError,
    ForgeForbidden,
    ForgeInvalid,
    ForgeLocked,
    ForgeNotFound,
    ForgeTokenScope,
    ForgeUnavailable,
)
from aiworker.adapters.forgejo.transport import Transport, TransportOptions, segment
from aiworker.errors import key_path

T = TypeVar("T", bound=BaseModel)
R = TypeVar("R")
REVIEW_EVENTS = ("APPROVED", "REQUEST_CHANGES", "COMMENT")
STATUS_STATES = ("pending", "success", "error", "failure", "warning")
MERGE_STYLES = ("merge", "rebase", "rebase-merge", "squash", "fast-forward-only")
# A request per token scope that the forge refuses after checking that scope (lacks_scope).
SCOPE_PROBES = {
    "read:issue": ("GET", "issues/0"),
    "write:issue": ("POST", "issues/0/comments"),
    "read:repository": ("GET", "pulls/0"),
    "write:repository": ("POST", "pulls/0/merge"),
}


def rfc3339(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError("use timezone-aware datetimes")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ForgejoClient:
    def __init__(self, base_url: str, token: str, **options: Unpack[TransportOptions]) -> None:
        """OPTIONS are the transport's: timeout, attempts, backoff_base, backoff_max, sleep."""
        self.http = Transport(base_url, token, **options)

    # plumbing --------------------------------------------------------------------------
    def _get(self, model: type[T], path: str, **params: Any) -> T:
        with self._answer("GET", path, model):
            return model.model_validate(
                self.http.request("GET", path, params=params or None).json()
            )

    def _list(self, model: type[T], path: str, **params: Any) -> list[T]:
        with self._answer("GET", path, model):
            items = self.http.pages(path, params, self.page_size)
            return [model.model_validate(item) for item in items]

    def _items(self, model: type[T], method: str, path: str, **options: Any) -> list[T]:
        """The list of MODEL one call answers (an endpoint that does not page)."""
        with self._answer(method, path, model):
            response = self.http.request(method, path, **options)
            return [model.model_validate(item) for item in response.json() or []]

    def _send(
        self,
        model: type[T],
        method: str,
        path: str,
        body: Any,
        ok: tuple[int, ...] = (200, 201),
        *,
        repeatable: bool = False,
    ) -> T:
        with self._answer(method, path, model):
            answer = self.http.request(method, path, json=body, ok=ok, repeatable=repeatable)
            return model.model_validate(answer.json())

    def _once(self, make: Callable[[], R], find: Callable[[], R | None]) -> R:
        """What MAKE makes, made once: when its answer was lost (the forge may have made
        it), what it made is looked for (FIND) after a pause before it is made again."""
        for attempt in range(1, self.http.attempts):
            try:
                return make()
            except ForgeAnswerLost:
                self.http.pause(attempt)
                found = find()
                if found is not None:
                    return found
        return make()

    @contextmanager
    def _answer(self, method: str, path: str, model: type[BaseModel]) -> Iterator[None]:
        """A success whose body is not the MODEL the API names (an HTML page from a proxy
        in front of the forge, another shape) is the forge's failure, named."""
        try:
            yield
        except (ValueError, TypeError, RecursionError) as exc:  # not JSON, or not MODEL
            if isinstance(exc, ValidationError):
                first = exc.errors()[0]
                what = f"{key_path(tuple(first['loc'])) or 'the body'}: {first['msg']}"
            else:
                what = f"not JSON ({type(exc).__name__})"
            detail = f"the answer is not a {model.__name__}: {what}"
            raise ForgeBadAnswer(method, path, 200, detail, forge=self.http.shown_base) from None

    @staticmethod
    def _repo(owner: str, repo: str) -> str:
        return f"/repos/{segment(owner)}/{segment(repo)}"

    @cached_property
    def settings(self) -> m.ApiSettings:
        return self._get(m.ApiSettings, "/settings/api")

    @property
    def page_size(self) -> int:
        return max(1, self.settings.max_response_items)

    def server_version(self) -> str:
        """The forge's version (GET /version)."""
        with self._answer("GET", "/version", m.ServerVersion):
            found = m.ServerVersion.model_validate(self.http.request("GET", "/version").json())
        return found.version or "unknown"

    # identity and repository -----------------------------------------------------------
    def current_user(self) -> m.User:
        return self._get(m.User, "/user")

    def repository(self, owner: str, repo: str) -> m.Repository:
        """The repository, its clone URL on the configured forge.url: git sends the token
        with every request to it, so never to an address the forge's answer names."""
        found = self._get(m.Repository, self._repo(owner, repo))
        clone_url = f"{self.http.plain_base}/{segment(owner)}/{segment(repo)}.git"
        return found.model_copy(update={"clone_url": clone_url})

    def lacks_scope(self, owner: str, repo: str, scope: str) -> bool:
        """Whether this token lacks SCOPE (read: or write: issue or repository), asked with
        a request for an issue or pull request numbered 0 in OWNER/REPO: the forge checks
        a route's scope before anything else of it, and then finds nothing, so nothing is
        read or written."""
        method, tail = SCOPE_PROBES[scope]
        try:
            body: dict[str, Any] | None = {} if method == "POST" else None
            self.http.request(method, f"{self._repo(owner, repo)}/{tail}", json=body)
        except ForgeTokenScope:
            return True
        except (ForgeNotFound, ForgeInvalid, ForgeConflict, ForgeForbidden, ForgeLocked):
            return False  # refused after the scope check: the token holds it
        return False

    def collaborator_permission(self, owner: str, repo: str, user: str) -> m.CollaboratorPermission:
        path = f"{self._repo(owner, repo)}/collaborators/{segment(user)}/permission"
        return self._get(m.CollaboratorPermission, path)

    def add_collaborator(self, owner: str, repo: str, user: str, permission: str = "write") -> None:
        path = f"{self._repo(owner, repo)}/collaborators/{segment(user)}"
        self.http.request("PUT", path, json={"permission": permission}, ok=(204,))

    # issues ----------------------------------------------------------------------------
    def list_issues(
        self,
        owner: str,
        repo: str,
        *,
        state: str = "open",
        labels: Iterable[str] = (),
        assignee: str | None = None,
        since: datetime | None = None,
    ) -> list[m.Issue]:
        params: dict[str, Any] = {"state": state, "type": "issues"}
        names = ",".join(labels)
        if names:
            params["labels"] = names
        if assignee:
            params["assigned_by"] = assignee
        if since is not None:
            params["since"] = rfc3339(since)
        return self._list(m.Issue, f"{self._repo(owner, repo)}/issues", **params)

    def issue(self, owner: str, repo: str, number: int) -> m.Issue:
        return self._get(m.Issue, f"{self._repo(owner, repo)}/issues/{number}")

    def timeline(self, owner: str, repo: str, number: int) -> list[m.TimelineComment]:
        return self._list(m.TimelineComment, f"{self._repo(owner, repo)}/issues/{number}/timeline")

    def comments(self, owner: str, repo: str, number: int) -> list[m.Comment]:
        return self._items(m.Comment, "GET", f"{self._repo(owner, repo)}/issues/{number}/comments")

    def create_comment(self, owner: str, repo: str, number: int, body: str) -> m.Comment:
        path = f"{self._repo(owner, repo)}/issues/{number}/comments"
        return self._once(
            lambda: self._send(m.Comment, "POST", path, {"body": body}, ok=(201,)),
            lambda: next(
                (c for c in self.comments(owner, repo, number)[-3:] if c.body == body), None
            ),
        )

    def edit_comment(self, owner: str, repo: str, comment_id: int, body: str) -> m.Comment:
        path = f"{self._repo(owner, repo)}/issues/comments/{comment_id}"
        return self._send(m.Comment, "PATCH", path, {"body": body}, ok=(200, 201))

    # labels ----------------------------------------------------------------------------
    def repo_labels(self, owner: str, repo: str) -> list[m.Label]:
        return self._list(m.Label, f"{self._repo(owner, repo)}/labels")

    def create_label(
        self, owner: str, repo: str, name: str, color: str = "#ededed", description: str = ""
    ) -> m.Label:
        body = {"name": name, "color": color, "description": description}
        return self._send(m.Label, "POST", f"{self._repo(owner, repo)}/labels", body, ok=(201,))

    def ensure_labels(self, owner: str, repo: str, names: Iterable[str]) -> dict[str, m.Label]:
        """Every named label, creating the missing ones."""
        existing = {label.name: label for label in self.repo_labels(owner, repo)}
        for name in names:
            if name not in existing:
                existing[name] = self.create_label(owner, repo, name)
        return existing

    def add_labels(
        self, owner: str, repo: str, number: int, labels: Iterable[int | str]
    ) -> list[m.Label]:
        path = f"{self._repo(owner, repo)}/issues/{number}/labels"
        return self._items(m.Label, "POST", path, json={"labels": list(labels)}, repeatable=True)

    def remove_label(self, owner: str, repo: str, number: int, label: int | str) -> None:
        path = f"{self._repo(owner, repo)}/issues/{number}/labels/{segment(label)}"
        self.http.request("DELETE", path, ok=(204,))

    # attachments -----------------------------------------------------------------------
    def attachments(self, owner: str, repo: str, number: int) -> list[m.Attachment]:
        return self._items(m.Attachment, "GET", f"{self._repo(owner, repo)}/issues/{number}/assets")

    def download_attachment(self, attachment: m.Attachment, max_bytes: int) -> bytes:
        """The attachment's bytes; refuses (without reading on) past MAX_BYTES."""
        if attachment.size > max_bytes:
            raise ForgeError(
                "GET",
                f"/attachments/{attachment.uuid}",
                None,
                f"attachment is {attachment.size} bytes, over {max_bytes}",
            )
        where = f"/attachments/{attachment.uuid}"
        if urlsplit(attachment.browser_download_url).netloc != urlsplit(self.http.base).netloc:
            # The token is sent with the download: only ever to the forge itself.
            raise ForgeError("GET", where, None, "the download is not on this forge's host")
        response = self.http.request("GET", "", url=attachment.browser_download_url, stream=True)
        data = bytearray()
        try:
            for chunk in response.iter_content(64 * 1024):
                data += chunk
                if len(data) > max_bytes:
                    raise ForgeError("GET", where, 200, f"attachment exceeds {max_bytes} bytes")
        except requests.RequestException as exc:
            raise ForgeUnavailable("GET", where, None, type(exc).__name__) from None
        finally:
            response.close()
        return bytes(data)

    # branches and refs -----------------------------------------------------------------
    def branches(self, owner: str, repo: str) -> list[m.Branch]:
        return self._list(m.Branch, f"{self._repo(owner, repo)}/branches")

    def branch(self, owner: str, repo: str, name: str) -> m.Branch:
        return self._get(
            m.Branch, f"{self._repo(owner, repo)}/branches/{segment(name, slashes=True)}"
        )

    def create_branch(self, owner: str, repo: str, name: str, start: str) -> m.Branch:
        body = {"new_branch_name": name, "old_ref_name": start}
        return self._send(m.Branch, "POST", f"{self._repo(owner, repo)}/branches", body, ok=(201,))

    def refs(self, owner: str, repo: str, prefix: str = "") -> list[m.Reference]:
        path = f"{self._repo(owner, repo)}/git/refs"
        if prefix:
            path += "/" + segment(prefix.removeprefix("refs/"), slashes=True)
        try:
            return self._items(m.Reference, "GET", path)
        except ForgeNotFound:
            return []

    # pull requests ---------------------------------------------------------------------
    def create_pull(
        self, owner: str, repo: str, *, head: str, base: str, title: str, body: str = ""
    ) -> m.PullRequest:
        payload = {"head": head, "base": base, "title": title, "body": body}
        return self._once(
            lambda: self._send(
                m.PullRequest, "POST", f"{self._repo(owner, repo)}/pulls", payload, ok=(201,)
            ),
            lambda: next(
                (p for p in self.pulls(owner, repo) if (p.head.ref, p.base.ref) == (head, base)),
                None,
            ),
        )

    def pull(self, owner: str, repo: str, number: int) -> m.PullRequest:
        return self._get(m.PullRequest, f"{self._repo(owner, repo)}/pulls/{number}")

    def pulls(self, owner: str, repo: str, state: str = "open") -> list[m.PullRequest]:
        return self._list(m.PullRequest, f"{self._repo(owner, repo)}/pulls", state=state)

    def update_pull(self, owner: str, repo: str, number: int, **fields: Any) -> m.PullRequest:
        allowed = {"title", "body", "state", "base"}
        if set(fields) - allowed:
            raise ValueError(f"update_pull accepts only {sorted(allowed)}")
        path = f"{self._repo(owner, repo)}/pulls/{number}"
        return self._send(m.PullRequest, "PATCH", path, fields, ok=(200, 201))

    def merge_pull(
        self,
        owner: str,
        repo: str,
        number: int,
        *,
        style: str = "merge",
        head_commit_id: str | None = None,
        title: str | None = None,
        message: str | None = None,
        delete_branch: bool = False,
    ) -> None:
        if style not in MERGE_STYLES:
            raise ValueError(f"merge style must be one of {MERGE_STYLES}")
        body: dict[str, Any] = {"Do": style, "delete_branch_after_merge": delete_branch}
        if head_commit_id:
            body["head_commit_id"] = head_commit_id
        if title:
            body["MergeTitleField"] = title
        if message:
            body["MergeMessageField"] = message
        path = f"{self._repo(owner, repo)}/pulls/{number}/merge"
        self._once(
            lambda: self.http.request("POST", path, json=body, ok=(200,)) is not None,
            lambda: self.pull(owner, repo, number).merged or None,
        )

    def is_merged(self, owner: str, repo: str, number: int) -> bool:
        path = f"{self._repo(owner, repo)}/pulls/{number}/merge"
        return self.http.request("GET", path, ok=(204, 404)).status_code == 204

    # reviews and statuses --------------------------------------------------------------
    def create_review(
        self,
        owner: str,
        repo: str,
        number: int,
        *,
        event: str,
        body: str,
        commit_id: str | None = None,
    ) -> m.PullReview:
        if event not in REVIEW_EVENTS:
            raise ValueError(f"review event must be one of {REVIEW_EVENTS}")
        payload: dict[str, Any] = {"event": event, "body": body}
        if commit_id:
            payload["commit_id"] = commit_id
        path = f"{self._repo(owner, repo)}/pulls/{number}/reviews"
        return self._once(
            lambda: self._send(m.PullReview, "POST", path, payload, ok=(200,)),
            lambda: next((r for r in self.reviews(owner, repo, number) if r.body == body), None),
        )

    def reviews(self, owner: str, repo: str, number: int) -> list[m.PullReview]:
        return self._list(m.PullReview, f"{self._repo(owner, repo)}/pulls/{number}/reviews")

    def create_status(
        self,
        owner: str,
        repo: str,
        sha: str,
        *,
        state: str,
        context: str,
        description: str = "",
        target_url: str = "",
    ) -> m.CommitStatus:
        if state not in STATUS_STATES:
            raise ValueError(f"status state must be one of {STATUS_STATES}")
        body = {
            "state": state,
            "context": context,
            "description": description,
            "target_url": target_url,
        }
        path = f"{self._repo(owner, repo)}/statuses/{segment(sha)}"  # the latest one counts
        return self._send(m.CommitStatus, "POST", path, body, ok=(201,), repeatable=True)

    def combined_status(self, owner: str, repo: str, ref: str) -> m.CombinedStatus:
        path = f"{self._repo(owner, repo)}/commits/{segment(ref, slashes=True)}/status"
        return self._get(m.CombinedStatus, path)
