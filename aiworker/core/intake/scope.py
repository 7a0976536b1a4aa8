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
ENTRYPOINTS = ("ci/run.sh", "ci/run")  # as the runner looks for them (runner/requests.py)
LINK, GITLINK = "120000", "160000"  # git's modes of a symbolic link and a submodule


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
    return problems + base_problems(cache, index, base)


def base_problems(cache: GitCache, index: int, base: str) -> list[str]:
    """Why a runner could not check a change on BASE: its entrypoint, or what it cannot
    check out."""
    entrypoint = _entrypoint_problem(cache, index, base)
    return ([entrypoint] if entrypoint else []) + _uncheckable(cache, index, base)


def no_commits(branch: str) -> str:
    return f"the repository has no commits on `{branch}` yet: push a first one, with `ci/run`"


def _entrypoint_problem(cache: GitCache, index: int, base: str) -> str | None:
    """Why a runner could not run the base's check entrypoint: it runs the first of
    ENTRYPOINTS there is, which must be an executable file (no link), in a `ci` that is a
    folder."""
    if cache.file_mode(index, base, "ci") == LINK:
        return f"`ci` in the base {base[:12]} is a symbolic link: make it a folder"
    for path in ENTRYPOINTS:
        mode = cache.file_mode(index, base, path)
        if mode == "100755":
            return None
        if mode is not None:
            what = "a symbolic link" if mode == LINK else "not executable"
            return (
                f"`{path}` in the base {base[:12]} is {what}; the host re-runs the first of "
                f"{' or '.join(ENTRYPOINTS)} there is to verify any change: make it an "
                "executable file"
            )
    return (
        f"the base {base[:12]} has no executable `ci/run` (or `ci/run.sh`): the host "
        "re-runs it to verify any change, so add it first"
    )


def _uncheckable(cache: GitCache, index: int, base: str) -> list[str]:
    """What in the base a runner cannot check out, so that no change could be verified:
    submodules (a runner has the repository's own files only) and names that are not
    UTF-8."""
    modules, names = [], []
    for mode, path in cache.tree_entries(index, base):
        if mode == GITLINK:
            modules.append(path.decode(errors="backslashreplace"))
        try:
            path.decode()
        except UnicodeDecodeError:
            names.append(path.decode(errors="backslashreplace"))
    problems = []
    if modules:
        problems.append(
            f"the base {base[:12]} holds submodules ({', '.join(modules[:5])}), whose files a "
            "runner does not have, so `ci/run` could not verify a change there"
        )
    if names:
        problems.append(
            f"the base {base[:12]} holds names that are not UTF-8 ({', '.join(names[:5])}), "
            "which a runner cannot check out: rename them"
        )
    return problems
