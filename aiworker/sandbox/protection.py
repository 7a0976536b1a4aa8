"""Branch protection as Forgejo enforces it when a pull request is merged."""

from __future__ import annotations

import re
from typing import Any

from aiworker.sandbox.render_code import latest_per_context


def matches(rule_name: str, branch: str) -> bool:
    """Forgejo's rule match: a plain name ignores case; a glob's `*` and `?` stay within
    one path segment, `**` crosses them."""
    if not any(c in rule_name for c in "*?[{"):
        return rule_name.casefold() == branch.casefold()
    pattern = ""
    for token in re.findall(r"\*\*|\*|\?|[^*?]+", rule_name):
        pattern += {"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
    return re.fullmatch(pattern, branch) is not None


def rule_for(repo: dict[str, Any], branch: str) -> dict[str, Any] | None:
    """The rule protecting BRANCH: an exact name before any glob, as Forgejo orders them."""
    rules = repo.get("protections", [])
    exact = [r for r in rules if r["rule_name"] == branch]
    return next(iter(exact), None) or next(
        (r for r in rules if matches(r["rule_name"], branch)), None
    )


def merge_refusal(repo: dict[str, Any], issue: dict[str, Any], head_sha: str) -> str | None:
    """Why the protected base refuses this merge now, or None."""
    rule = rule_for(repo, issue["pull"]["base"])
    if rule is None:
        return None
    reviews = [r for r in issue["pull"]["reviews"] if r["official"] and not r.get("dismissed")]
    latest: dict[str, dict[str, Any]] = {}
    for review in reviews:
        if review["state"] in ("APPROVED", "REQUEST_CHANGES"):
            latest[review["user"]] = review
    if rule.get("block_on_rejected_reviews") and any(
        r["state"] == "REQUEST_CHANGES" for r in latest.values()
    ):
        return "the pull request has official reviews requesting changes"
    approvals = [
        r
        for r in latest.values()
        if r["state"] == "APPROVED"
        and not (rule.get("ignore_stale_approvals") and r["commit_id"] != head_sha)
    ]
    if len(approvals) < rule.get("required_approvals", 0):
        return "does not have enough approvals"
    if rule.get("enable_status_check"):
        states = {
            s["context"]: s["state"] for s in latest_per_context(repo["statuses"].get(head_sha, []))
        }
        for context in rule.get("status_check_contexts") or []:
            if states.get(context) != "success":
                return f"required status check {context!r} is not successful"
    return None
