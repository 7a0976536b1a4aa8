"""What an issue asks for, checked before anything is spent on it.

The requirements fingerprint tells later phases when scope changed; the checks
block names the commands the host re-runs; check_inputs() finds what would make
an attempt fail whatever a model does (a malformed checks block, a base without
the entrypoint, an empty issue), so that the task waits for its issue to be
fixed instead of burning inference.
"""

from __future__ import annotations

import hashlib
import json

from aiworker.adapters.forgejo.models import Issue
from aiworker.core.evidence.requirements import requirements_from_issue
from aiworker.errors import InvalidInput
from aiworker.runtime.gitcache import GitCache

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp")
# The runner resolves the selector to the first of these that exists (runner/requests.py).
ENTRYPOINTS = ("ci/run.sh", "ci/run")


def fingerprint(issue: Issue, approval_label: str = "") -> str:
    """What the requirements are: title, body, labels and eligible images. The plan
    approval label (APPROVAL_LABEL) approves a scope; it is not part of it."""
    labels = sorted(n for n in issue.label_names if n != approval_label)
    return _digest({**_authored(issue), "labels": labels})


def authored(issue: Issue) -> str:
    """What the issue's author can change of its requirements (its title, body and
    images; labels only a writer can): the part an authorisation must cover."""
    return _digest(_authored(issue))


def _authored(issue: Issue) -> dict[str, object]:
    images = sorted(
        (a.name, a.size, a.uuid) for a in issue.assets if a.name.lower().endswith(IMAGE_SUFFIXES)
    )
    return {"title": issue.title, "body": issue.body, "images": images}


def _digest(document: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def check_inputs(issue: Issue, cache: GitCache, index: int, base: str) -> list[str]:
    """What must change on the forge before an attempt can succeed; empty when nothing."""
    problems = []
    if not (issue.title or "").strip() and not (issue.body or "").strip():
        problems.append("the issue has neither a title nor a description to work from")
    try:
        requirements_from_issue(issue.body)
    except InvalidInput as exc:
        problems.append(f"the `aiworker-checks` block is malformed: {exc.message}")
    modes = [cache.file_mode(index, base, path) for path in ENTRYPOINTS]
    if not any(mode == "100755" for mode in modes):
        problems.append(
            f"the base {base[:12]} has no executable `ci/run` (or `ci/run.sh`): the host "
            "re-runs it to verify any change, so add it first"
        )
    return problems
