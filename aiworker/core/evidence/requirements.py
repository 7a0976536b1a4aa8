"""What a task must show before its work is accepted: the checks its issue asks for in
an `aiworker-checks` block (each a ./ci/run invocation with its expected exit code and
measured thresholds), or the repository's ./ci/run alone. The evidence gate runs them;
intake checks the block before anything is spent; a plan adds its milestones'."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace

from aiworker.contracts.runner import ENTRYPOINT_SELECTOR
from aiworker.core.evidence.measurements import Threshold, threshold_line
from aiworker.errors import InvalidInput

BLOCK = re.compile(r"```aiworker-checks[^\n]*\n(.*?)```", re.DOTALL)
CHECK_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# The check an issue without a checks block gets: the repository's own ./ci/run.
DEFAULT_CHECK = "ci"


@dataclass(frozen=True)
class Requirement:
    check_id: str
    argv: tuple[str, ...]
    expected_exit_code: int = 0
    thresholds: tuple[Threshold, ...] = ()  # evidence/measurements.py


def default_requirements() -> list[Requirement]:
    """The repository's ./ci/run alone, what an issue without a checks block asks for."""
    return [Requirement(DEFAULT_CHECK, (ENTRYPOINT_SELECTOR,))]


def requirements_from_issue(body: str) -> list[Requirement]:
    """The checks an issue asks for, or the repository's ./ci/run."""
    found = BLOCK.search(body or "")
    if not found:
        return default_requirements()
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
    return requirements or default_requirements()


def _with_threshold(
    requirements: list[Requirement], check_id: str, threshold: Threshold, number: int
) -> list[Requirement]:
    for n, requirement in enumerate(requirements):
        if requirement.check_id == check_id:
            thresholds = (*requirement.thresholds, threshold)
            requirements[n] = replace(requirement, thresholds=thresholds)
            return requirements
    raise InvalidInput(f"aiworker-checks line {number}: no check {check_id!r} declared above")
