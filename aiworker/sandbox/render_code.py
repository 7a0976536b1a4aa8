"""JSON shapes that read the bare repository: pull requests, branches, statuses, reviews."""

from __future__ import annotations

from typing import Any

from aiworker.sandbox.gitrepo import BareRepo
from aiworker.sandbox.merge import mergeable
from aiworker.sandbox.render import Renderer

STATE_ORDER = {"error": 4, "failure": 3, "warning": 2, "pending": 1, "success": 0}


def pull(
    r: Renderer, repo: dict[str, Any], issue: dict[str, Any], git: BareRepo, viewer: str | None
) -> dict[str, Any]:
    full = f"{repo['owner']}/{repo['name']}"
    meta = issue["pull"]
    head_sha = meta["merged_head"] if meta["merged"] else git.branch_sha(meta["head"])
    base_sha = git.branch_sha(meta["base"]) or ""
    head_sha = head_sha or meta.get("last_head", "")
    adds = dels = files = 0
    can_merge = False
    merge_base = ""
    if head_sha and base_sha:
        adds, dels, files = git.diff_stats(base_sha, head_sha)
        merge_base = git.merge_base(base_sha, head_sha) or ""
        can_merge = not meta["merged"] and mergeable(git, base_sha, head_sha)
    base_repo = r.repository(repo, viewer)
    shaped = r.issue(repo, issue)
    return {
        "id": issue["id"],
        "url": f"{r.root}{full}/pulls/{issue['number']}",
        "number": issue["number"],
        "user": shaped["user"],
        "title": issue["title"],
        "body": issue["body"],
        "labels": shaped["labels"],
        "milestone": None,
        "assignee": shaped["assignee"],
        "assignees": shaped["assignees"],
        "requested_reviewers": [r.user(login) for login in meta.get("requested", [])] or None,
        "requested_reviewers_teams": None,
        "state": issue["state"],
        "draft": False,
        "is_locked": False,
        "comments": len(issue["comments"]),
        "review_comments": sum(len(v.get("comments", [])) for v in meta["reviews"]),
        "additions": adds,
        "deletions": dels,
        "changed_files": files,
        "html_url": f"{r.root}{full}/pulls/{issue['number']}",
        "diff_url": f"{r.root}{full}/pulls/{issue['number']}.diff",
        "patch_url": f"{r.root}{full}/pulls/{issue['number']}.patch",
        "mergeable": can_merge,
        "merged": meta["merged"],
        "merged_at": meta["merged_at"],
        "merge_commit_sha": meta["merge_commit_sha"],
        "merged_by": r.user(meta["merged_by"]),
        "allow_maintainer_edit": False,
        "base": {
            "label": meta["base"],
            "ref": meta["base"],
            "sha": base_sha,
            "repo_id": repo["id"],
            "repo": base_repo,
        },
        "head": {
            "label": meta["head"],
            "ref": meta["head"],
            "sha": head_sha,
            "repo_id": repo["id"],
            "repo": base_repo,
        },
        "merge_base": merge_base,
        "due_date": None,
        "created_at": issue["created_at"],
        "updated_at": issue["updated_at"],
        "closed_at": issue["closed_at"],
        "pin_order": 0,
        "flow": 0,
    }


def branch(
    r: Renderer, repo: dict[str, Any], git: BareRepo, name: str, sha: str, viewer: str | None
) -> dict[str, Any]:
    info = git.commit(sha)
    can_push = r.state.can(repo, viewer, "write")
    return {
        "name": name,
        "commit": {
            "id": info.sha,
            "message": info.message,
            "url": f"{r.root}{repo['owner']}/{repo['name']}/commit/{info.sha}",
            "author": None,
            "committer": None,
            "verification": None,
            "timestamp": info.timestamp,
            "added": None,
            "removed": None,
            "modified": None,
        },
        "protected": False,
        "required_approvals": 0,
        "enable_status_check": False,
        "status_check_contexts": [],
        "user_can_push": can_push,
        "user_can_merge": can_push,
        "effective_branch_protection_name": "",
    }


def status(r: Renderer, repo: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": item["id"],
        "status": item["state"],
        "target_url": item["target_url"],
        "description": item["description"],
        "url": f"{r.root}api/v1/repos/{repo['owner']}/{repo['name']}/statuses/{item['sha']}",
        "context": item["context"],
        "creator": r.user(item["creator"]),
        "created_at": item["created_at"],
        "updated_at": item["created_at"],
    }


def latest_per_context(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for item in items:
        latest[item["context"]] = item
    return list(latest.values())


def combined_state(items: list[dict[str, Any]]) -> str:
    if not items:
        return "pending"
    return str(max((i["state"] for i in items), key=lambda s: STATE_ORDER.get(s, 0)))


def review(
    r: Renderer, repo: dict[str, Any], issue: dict[str, Any], item: dict[str, Any], head: str
) -> dict[str, Any]:
    full = f"{repo['owner']}/{repo['name']}"
    return {
        "id": item["id"],
        "user": r.user(item["user"]),
        "team": None,
        "state": item["state"],
        "body": item["body"],
        "commit_id": item["commit_id"],
        "stale": bool(item["commit_id"] and head and item["commit_id"] != head),
        "official": item["official"],
        "dismissed": bool(item.get("dismissed", False)),
        "comments_count": len(item.get("comments", [])),
        "submitted_at": item["submitted_at"],
        "updated_at": item["submitted_at"],
        "html_url": f"{r.root}{full}/pulls/{issue['number']}#issuecomment-{item['id']}",
        "pull_request_url": f"{r.root}{full}/pulls/{issue['number']}",
    }


def review_comment(
    r: Renderer,
    repo: dict[str, Any],
    issue: dict[str, Any],
    item: dict[str, Any],
    comment: dict[str, Any],
) -> dict[str, Any]:
    full = f"{repo['owner']}/{repo['name']}"
    return {
        "id": comment["id"],
        "body": comment["body"],
        "user": r.user(item["user"]),
        "resolver": None,
        "pull_request_review_id": item["id"],
        "created_at": comment["created_at"],
        "updated_at": comment["created_at"],
        "path": comment["path"],
        "commit_id": item["commit_id"],
        "original_commit_id": item["commit_id"],
        "diff_hunk": "",
        "position": comment["new"],
        "original_position": comment["old"],
        "html_url": f"{r.root}{full}/pulls/{issue['number']}#issuecomment-{comment['id']}",
        "pull_request_url": f"{r.root}{full}/pulls/{issue['number']}",
    }
