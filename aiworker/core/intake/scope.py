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
import re
import shlex
from dataclasses import dataclass, replace

from aiworker.adapters.forgejo.models import Issue
from aiworker.contracts.runner import ENTRYPOINT_SELECTOR
from aiworker.core.evidence.measurements import Threshold, threshold_line
from aiworker.errors import InvalidInput
from aiworker.runtime.gitcache import GitCache

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp")
BLOCK = re.compile(r"```aiworker-checks[^\n]*\n(.*?)```", re.DOTALL)
CHECK_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# The runner resolves the selector to the first of these that exists (runner/requests.py).
ENTRYPOINTS = ("ci/run.sh", "ci/run")


@dataclass(frozen=True)
class Requirement:
    check_id: str
    argv: tuple[str, ...]
    expected_exit_code: int = 0
    thresholds: tuple[Threshold, ...] = ()  # evidence/measurements.py


def fingerprint(issue: Issue, approval_label: str = "") -> str:
    """What the requirements are: title, body, labels and eligible images. The plan
    approval label (APPROVAL_LABEL) approves a scope; it is not part of it."""
    images = sorted(
        (a.name, a.size, a.uuid) for a in issue.assets if a.name.lower().endswith(IMAGE_SUFFIXES)
    )
    document = {
        "title": issue.title,
        "body": issue.body,
        "labels": sorted(n for n in issue.label_names if n != approval_label),
        "images": images,
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def requirements_from_issue(body: str) -> list[Requirement]:
    """The checks an issue asks for, or the repository's ./ci/run."""
    found = BLOCK.search(body or "")
    if not found:
        return [Requirement("ci", (ENTRYPOINT_SELECTOR,))]
    requirements: list[Requirement] = []
    for number, line in enumerate(found.group(1).splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        measured = threshold_line(line)
        if measured is not None:
            requirements = _with_threshold(requirements, *measured, number)
            continue
        check_id, sep, command = line.partition(":")
        try:
            argv = tuple(shlex.split(command))
        except ValueError as exc:
            raise InvalidInput(f"aiworker-checks line {number}: {exc}") from None
        if not sep or not CHECK_ID.match(check_id.strip()) or not argv:
            raise InvalidInput(f"aiworker-checks line {number}: expected 'check_id: ./ci/run ARGS'")
        if argv[0] != ENTRYPOINT_SELECTOR:
            raise InvalidInput(f"aiworker-checks line {number}: checks run {ENTRYPOINT_SELECTOR}")
        requirements.append(Requirement(check_id.strip(), argv))
    if len({r.check_id for r in requirements}) != len(requirements):
        raise InvalidInput("aiworker-checks: each check id may appear once")
    return requirements or [Requirement("ci", (ENTRYPOINT_SELECTOR,))]


def _with_threshold(
    requirements: list[Requirement], check_id: str, threshold: Threshold, number: int
) -> list[Requirement]:
    for n, requirement in enumerate(requirements):
        if requirement.check_id == check_id:
            thresholds = (*requirement.thresholds, threshold)
            requirements[n] = replace(requirement, thresholds=thresholds)
            return requirements
    raise InvalidInput(f"aiworker-checks line {number}: no check {check_id!r} declared above")


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
