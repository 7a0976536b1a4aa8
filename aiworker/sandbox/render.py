"""The sandbox's JSON shapes, field for field as Forgejo's API returns them."""

from __future__ import annotations

from typing import Any

from aiworker.sandbox.state import ForgeState

EPOCH = "1970-01-01T00:00:00Z"


class Renderer:
    def __init__(self, state: ForgeState, root_url: str) -> None:
        self.state = state
        self.root = root_url.rstrip("/") + "/"

    def user(self, login: str | None) -> dict[str, Any] | None:
        if login is None:
            return None
        user = self.state.user(login) or {
            "id": 0,
            "login": login,
            "is_admin": False,
            "created": EPOCH,
        }
        return {
            "id": user["id"],
            "login": login,
            "login_name": "",
            "source_id": 0,
            "full_name": login,
            "email": f"{login}@sandbox.invalid",
            "avatar_url": f"{self.root}avatars/{login}",
            "html_url": f"{self.root}{login}",
            "language": "",
            "is_admin": bool(user["is_admin"]),
            "last_login": EPOCH,
            "created": user["created"],
            "restricted": False,
            "active": True,
            "prohibit_login": False,
            "location": "",
            "pronouns": "",
            "website": "",
            "description": "",
            "visibility": "public",
            "followers_count": 0,
            "following_count": 0,
            "starred_repos_count": 0,
        }

    def repository(self, repo: dict[str, Any], viewer: str | None) -> dict[str, Any]:
        full = f"{repo['owner']}/{repo['name']}"
        open_issues = sum(1 for i in repo["issues"] if i["state"] == "open" and not i["pull"])
        open_pulls = sum(1 for i in repo["issues"] if i["state"] == "open" and i["pull"])
        access = self.state.permission(repo, viewer)
        return {
            "id": repo["id"],
            "owner": self.user(repo["owner"]),
            "name": repo["name"],
            "full_name": full,
            "description": "",
            "empty": False,
            "private": repo["private"],
            "fork": False,
            "template": False,
            "mirror": False,
            "size": 0,
            "language": "",
            "languages_url": f"{self.root}api/v1/repos/{full}/languages",
            "html_url": f"{self.root}{full}",
            "url": f"{self.root}api/v1/repos/{full}",
            "link": "",
            "ssh_url": f"git@sandbox.invalid:{full}.git",
            "clone_url": f"{self.root}{full}.git",
            "original_url": "",
            "website": "",
            "stars_count": 0,
            "forks_count": 0,
            "watchers_count": 0,
            "open_issues_count": open_issues,
            "open_pr_counter": open_pulls,
            "release_counter": 0,
            "default_branch": repo["default_branch"],
            "archived": bool(repo.get("archived")),
            "created_at": repo["created_at"],
            "updated_at": repo["updated_at"],
            "archived_at": EPOCH,
            "permissions": {
                "admin": access in ("admin", "owner"),
                "push": access in ("write", "admin", "owner"),
                "pull": access != "none",
            },
            "has_issues": True,
            "has_wiki": False,
            "has_pull_requests": True,
            "has_projects": False,
            "has_releases": False,
            "has_packages": False,
            "has_actions": False,
            "ignore_whitespace_conflicts": False,
            "allow_merge_commits": True,
            "allow_rebase": True,
            "allow_rebase_explicit": True,
            "allow_squash_merge": True,
            "allow_fast_forward_only_merge": True,
            "allow_rebase_update": True,
            "default_delete_branch_after_merge": False,
            "default_merge_style": "merge",
            "default_update_style": "merge",
            "default_allow_maintainer_edit": False,
            "avatar_url": "",
            "internal": False,
            "mirror_interval": "",
            "object_format_name": "sha1",
            "mirror_updated": EPOCH,
            "topics": [],
            "wiki_branch": "",
            "globally_editable_wiki": False,
        }

    def label(self, repo: dict[str, Any], label: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": label["id"],
            "name": label["name"],
            "exclusive": False,
            "is_archived": False,
            "color": label["color"],
            "description": label.get("description", ""),
            "url": f"{self.root}api/v1/repos/{repo['owner']}/{repo['name']}/labels/{label['id']}",
        }

    def attachment(self, asset: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": asset["id"],
            "name": asset["name"],
            "size": asset["size"],
            "download_count": 0,
            "created_at": asset["created_at"],
            "uuid": asset["uuid"],
            "browser_download_url": f"{self.root}attachments/{asset['uuid']}",
            "type": "attachment",
        }

    def issue(self, repo: dict[str, Any], issue: dict[str, Any]) -> dict[str, Any]:
        full = f"{repo['owner']}/{repo['name']}"
        kind = "pulls" if issue["pull"] else "issues"
        labels = [self.label(repo, lb) for lb in repo["labels"] if lb["id"] in issue["labels"]]
        assignees = [self.user(login) for login in issue["assignees"]]
        pull = issue["pull"]
        return {
            "id": issue["id"],
            "url": f"{self.root}api/v1/repos/{full}/issues/{issue['number']}",
            "html_url": f"{self.root}{full}/{kind}/{issue['number']}",
            "number": issue["number"],
            "user": self.user(issue["user"]),
            "original_author": "",
            "original_author_id": 0,
            "title": issue["title"],
            "body": issue["body"],
            "ref": "",
            "assets": [self.attachment(a) for a in issue["assets"]],
            "labels": labels,
            "milestone": None,
            "assignee": assignees[0] if assignees else None,
            "assignees": assignees or None,
            "state": issue["state"],
            "is_locked": False,
            "comments": len(issue["comments"]),
            "created_at": issue["created_at"],
            "updated_at": issue["updated_at"],
            "closed_at": issue["closed_at"],
            "due_date": None,
            "pin_order": 0,
            "pull_request": None
            if not pull
            else {
                "merged": pull["merged"],
                "merged_at": pull["merged_at"],
                "draft": False,
                "html_url": f"{self.root}{full}/pulls/{issue['number']}",
            },
            "repository": {
                "id": repo["id"],
                "name": repo["name"],
                "owner": repo["owner"],
                "full_name": full,
            },
        }

    def _links(
        self, repo: dict[str, Any], issue: dict[str, Any], item: int, kind: str
    ) -> dict[str, str]:
        """A comment's or a timeline item's links: ITEM's on the issue's KIND page."""
        at = f"{self.root}{repo['owner']}/{repo['name']}"
        return {
            "html_url": f"{at}/{kind}/{issue['number']}#issuecomment-{item}",
            "pull_request_url": f"{at}/pulls/{issue['number']}" if issue["pull"] else "",
            "issue_url": f"{at}/issues/{issue['number']}",
        }

    def comment(
        self, repo: dict[str, Any], issue: dict[str, Any], comment: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "id": comment["id"],
            **self._links(repo, issue, comment["id"], "issues"),
            "user": self.user(comment["user"]),
            "original_author": "",
            "original_author_id": 0,
            "body": comment["body"],
            "assets": [],
            "created_at": comment["created_at"],
            "updated_at": comment["updated_at"],
        }

    def timeline(
        self, repo: dict[str, Any], issue: dict[str, Any], event: dict[str, Any]
    ) -> dict[str, Any]:
        """Forgejo's full TimelineComment: every key, whatever the event's type."""
        kind = "pulls" if issue["pull"] else "issues"
        label = self.state.label(repo, event["label"]) if "label" in event else None
        return {
            "id": event["id"],
            "type": event["type"],
            **self._links(repo, issue, event["id"], kind),
            "user": self.user(event["user"]),
            "body": event.get("body", ""),
            "created_at": event["created_at"],
            "updated_at": event.get("updated_at", event["created_at"]),
            "old_project_id": 0,
            "project_id": 0,
            "old_milestone": None,
            "milestone": None,
            "tracked_time": None,
            "old_title": event.get("old_title", ""),
            "new_title": event.get("new_title", ""),
            "old_ref": event.get("old_ref", ""),
            "new_ref": event.get("new_ref", ""),
            "ref_issue": None,
            "ref_comment": None,
            "ref_action": "",
            "ref_commit_sha": event.get("ref_commit_sha", ""),
            "review_id": event.get("review_id", 0),
            "label": self.label(repo, label) if label else None,
            "assignee": self.user(event.get("assignee")),
            "assignee_team": None,
            "removed_assignee": bool(event.get("removed", False)),
            "resolve_doer": None,
            "dependent_issue": None,
        }
