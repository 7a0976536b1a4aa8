"""The sandbox forge's data: users, repositories, issues and pull requests, persisted as JSON.

All mutations happen under one lock and are written atomically to DIR/state.json,
so a restarted server sees exactly what the last request left.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from aiworker.runtime.atomic import write_private_file

ACCESS = {"none": 0, "read": 1, "write": 2, "admin": 3, "owner": 4}


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ForgeState:
    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir
        self.path = data_dir / "state.json"
        self.lock = threading.RLock()
        self.data: dict[str, Any] = {"next_id": 1, "users": {}, "repos": {}, "attachments": {}}
        self._mtime = 0
        self.refresh()

    def refresh(self) -> None:
        """Reload when another process (sandbox seed) changed the file."""
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return
        if mtime != self._mtime:
            self.data = json.loads(self.path.read_text())
            self._mtime = mtime

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_private_file(self.path, json.dumps(self.data, sort_keys=True).encode())
        self._mtime = self.path.stat().st_mtime_ns

    def new_id(self) -> int:
        value = int(self.data["next_id"])
        self.data["next_id"] = value + 1
        return value

    # users -------------------------------------------------------------------------------
    def add_user(
        self, login: str, *, admin: bool = False, token: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            if login in self.data["users"]:
                return dict(self.data["users"][login])
            user = {
                "id": self.new_id(),
                "login": login,
                "is_admin": admin,
                "token": token or secrets.token_hex(20),
                "created": now_iso(),
            }
            self.data["users"][login] = user
            self.save()
            return dict(user)

    def user_by_token(self, token: str) -> dict[str, Any] | None:
        """The user TOKEN stands for, with the scopes it holds (a user's own: all)."""
        for user in self.data["users"].values():
            if secrets.compare_digest(user["token"], token):
                return {**user, "scopes": ["all"]}
        for value, scoped in self.data.get("tokens", {}).items():
            owner = self.data["users"].get(scoped["login"])
            if owner is not None and secrets.compare_digest(value, token):
                return {**owner, "scopes": list(scoped["scopes"])}
        return None

    def user(self, login: str) -> dict[str, Any] | None:
        found = self.data["users"].get(login)
        return dict(found) if found else None

    # repositories ------------------------------------------------------------------------
    def repo(self, owner: str, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.data["repos"].get(f"{owner}/{name}")
        return found

    def add_repo(self, owner: str, name: str, *, private: bool = False) -> dict[str, Any]:
        with self.lock:
            key = f"{owner}/{name}"
            if key not in self.data["repos"]:
                self.data["repos"][key] = {
                    "id": self.new_id(),
                    "owner": owner,
                    "name": name,
                    "private": private,
                    "default_branch": "main",
                    "created_at": now_iso(),
                    "updated_at": now_iso(),
                    "collaborators": {},
                    "labels": [],
                    "issues": [],
                    "next_index": 1,
                    "statuses": {},
                }
                self.save()
            return self.data["repos"][key]  # type: ignore[no-any-return]

    def permission(self, repo: dict[str, Any], login: str | None) -> str:
        """Forgejo's access mode of LOGIN on REPO."""
        if login is None:
            return "none" if repo["private"] else "read"
        if login == repo["owner"]:
            return "owner"
        user = self.data["users"].get(login)
        if user and user["is_admin"]:
            return "admin"
        granted = repo["collaborators"].get(login)
        if granted:
            return str(granted)
        return "none" if repo["private"] else "read"

    def can(self, repo: dict[str, Any], login: str | None, needed: str) -> bool:
        return ACCESS[self.permission(repo, login)] >= ACCESS[needed]

    # issues ------------------------------------------------------------------------------
    def issue(self, repo: dict[str, Any], number: int) -> dict[str, Any] | None:
        for issue in repo["issues"]:
            if issue["number"] == number:
                return issue  # type: ignore[no-any-return]
        return None

    def add_issue(
        self, repo: dict[str, Any], author: str, title: str, body: str = "", **extra: Any
    ) -> dict[str, Any]:
        with self.lock:
            number = repo["next_index"]
            repo["next_index"] = number + 1
            stamp = now_iso()
            issue = {
                "id": self.new_id(),
                "number": number,
                "title": title,
                "body": body,
                "user": author,
                "state": "open",
                "labels": [],
                "assignees": [],
                "comments": [],
                "timeline": [],
                "assets": [],
                "created_at": stamp,
                "updated_at": stamp,
                "closed_at": None,
                "pull": None,
            }
            issue.update(extra)
            repo["issues"].append(issue)
            self.save()
            return issue

    def record(self, issue: dict[str, Any], kind: str, user: str, **data: Any) -> None:
        """One timeline event, as Forgejo records a comment of that type (a plain comment's
        event is the comment itself: DATA then carries its id)."""
        event = {"type": kind, "user": user, "created_at": now_iso(), **data}
        event.setdefault("id", self.new_id())
        issue["timeline"].append(event)

    def give_at_creation(
        self,
        repo: dict[str, Any],
        issue: dict[str, Any],
        user: str,
        labels: list[int],
        assignees: list[str],
    ) -> None:
        """Labels (ids) and assignees (logins) given when the issue is created, recorded
        as Forgejo records them: timeline events by the author."""
        wanted = set(labels)
        for label in repo["labels"]:
            if label["id"] in wanted:
                issue["labels"].append(label["id"])
                self.record(issue, "label", user, label=label["id"], body="1")
        for login in dict.fromkeys(assignees):
            if self.user(login):
                issue["assignees"].append(login)
                self.record(issue, "assignees", user, assignee=login)

    def touch(self, issue: dict[str, Any]) -> None:
        issue["updated_at"] = now_iso()

    def changed(self, issue: dict[str, Any]) -> None:
        """The issue changed: it is updated now, and the state is saved."""
        self.touch(issue)
        self.save()

    def label(self, repo: dict[str, Any], ident: str | int) -> dict[str, Any] | None:
        for label in repo["labels"]:
            if label["id"] == ident or label["name"] == ident or str(label["id"]) == str(ident):
                return label  # type: ignore[no-any-return]
        return None
