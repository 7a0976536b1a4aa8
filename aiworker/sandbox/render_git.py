"""JSON shapes of git objects as Forgejo's API returns them: commits, files, contents,
branch protections."""

from __future__ import annotations

import base64
from typing import Any

from aiworker.sandbox.gitrepo import BareRepo, FileChange, LogEntry, TreeEntry
from aiworker.sandbox.render import Renderer

KINDS = {"blob": "file", "tree": "dir", "commit": "submodule"}
SYMLINK_MODE = "120000"
ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time: what Forgejo sends for a parent's date
PROTECTION_LISTS = (
    "push_whitelist_usernames",
    "push_whitelist_teams",
    "merge_whitelist_usernames",
    "merge_whitelist_teams",
    "approvals_whitelist_username",
    "approvals_whitelist_teams",
    "status_check_contexts",
)
PROTECTION_FLAGS = (
    "enable_push",
    "enable_push_whitelist",
    "push_whitelist_deploy_keys",
    "enable_merge_whitelist",
    "enable_status_check",
    "enable_approvals_whitelist",
    "block_on_rejected_reviews",
    "block_on_official_review_requests",
    "block_on_outdated_branch",
    "dismiss_stale_approvals",
    "ignore_stale_approvals",
    "require_signed_commits",
    "apply_to_admins",
)


def api_base(r: Renderer, repo: dict[str, Any]) -> str:
    return f"{r.root}api/v1/repos/{repo['owner']}/{repo['name']}"


def commit(
    r: Renderer, repo: dict[str, Any], entry: LogEntry, files: list[FileChange] | None = None
) -> dict[str, Any]:
    api, html = api_base(r, repo), f"{r.root}{repo['owner']}/{repo['name']}"

    def person(who: tuple[str, str, str]) -> dict[str, str]:
        return {"name": who[0], "email": who[1], "date": who[2]}

    def account(who: tuple[str, str, str]) -> dict[str, Any] | None:
        login = who[1].removesuffix("@sandbox.invalid")
        return r.user(login) if login != who[1] and r.state.user(login) else None

    shaped: dict[str, Any] = {
        "url": f"{api}/git/commits/{entry.sha}",
        "sha": entry.sha,
        "created": entry.committer[2],
        "html_url": f"{html}/commit/{entry.sha}",
        "commit": {
            "url": f"{api}/git/commits/{entry.sha}",
            "author": person(entry.author),
            "committer": person(entry.committer),
            "message": entry.message,
            "tree": {
                "url": f"{api}/git/trees/{entry.tree}",
                "sha": entry.tree,
                "created": entry.committer[2],
            },
            "verification": {
                "verified": False,
                "reason": "gpg.error.not_signed_commit",
                "signature": "",
                "signer": None,
                "payload": "",
            },
        },
        "author": account(entry.author),
        "committer": account(entry.committer),
        "parents": [
            {"url": f"{api}/git/commits/{p}", "sha": p, "created": ZERO_TIME} for p in entry.parents
        ],
    }
    if files is not None:
        adds = sum(f.additions for f in files)
        dels = sum(f.deletions for f in files)
        shaped["files"] = [{"filename": f.filename, "status": f.status} for f in files]
        shaped["stats"] = {"total": adds + dels, "additions": adds, "deletions": dels}
    return shaped


def changed_file(
    r: Renderer, repo: dict[str, Any], change: FileChange, head: str
) -> dict[str, Any]:
    api, html = api_base(r, repo), f"{r.root}{repo['owner']}/{repo['name']}"
    return {
        "filename": change.filename,
        "previous_filename": change.previous,
        "status": change.status,
        "additions": change.additions,
        "deletions": change.deletions,
        "changes": change.additions + change.deletions,
        "html_url": f"{html}/src/commit/{head}/{change.filename}",
        "contents_url": f"{api}/contents/{change.filename}?ref={head}",
        "raw_url": f"{html}/raw/commit/{head}/{change.filename}",
    }


def contents(
    r: Renderer,
    repo: dict[str, Any],
    git: BareRepo,
    entry: TreeEntry,
    ref: str,
    last: LogEntry | None,
    *,
    with_content: bool,
) -> dict[str, Any]:
    api, html = api_base(r, repo), f"{r.root}{repo['owner']}/{repo['name']}"
    kind = "symlink" if entry.mode == SYMLINK_MODE else KINDS.get(entry.kind, "file")
    data = git.blob(entry.sha) if entry.kind == "blob" and with_content else None
    self_url = f"{api}/contents/{entry.path}?ref={ref}"
    git_url = f"{api}/git/{'trees' if entry.kind == 'tree' else 'blobs'}/{entry.sha}"
    html_url = f"{html}/src/branch/{ref}/{entry.path}"
    return {
        "name": entry.path.rsplit("/", 1)[-1],
        "path": entry.path,
        "sha": entry.sha,
        "last_commit_sha": last.sha if last else "",
        "last_commit_when": last.committer[2] if last else ZERO_TIME,
        "type": kind,
        "size": entry.size,
        "encoding": "base64" if data is not None and kind == "file" else None,
        "content": base64.b64encode(data).decode() if data is not None and kind == "file" else None,
        "target": data.decode(errors="replace") if data is not None and kind == "symlink" else None,
        "url": self_url,
        "html_url": html_url,
        "git_url": git_url,
        "download_url": f"{html}/raw/branch/{ref}/{entry.path}" if entry.kind == "blob" else None,
        "submodule_git_url": None,
        "_links": {"self": self_url, "git": git_url, "html": html_url},
    }


def protection(rule: dict[str, Any]) -> dict[str, Any]:
    shaped: dict[str, Any] = {
        "branch_name": rule["rule_name"],
        "rule_name": rule["rule_name"],
        "required_approvals": rule.get("required_approvals", 0),
        "protected_file_patterns": rule.get("protected_file_patterns", ""),
        "unprotected_file_patterns": rule.get("unprotected_file_patterns", ""),
        "created_at": rule["created_at"],
        "updated_at": rule["updated_at"],
    }
    shaped.update({name: bool(rule.get(name, False)) for name in PROTECTION_FLAGS})
    shaped.update({name: list(rule.get(name) or []) for name in PROTECTION_LISTS})
    return shaped
