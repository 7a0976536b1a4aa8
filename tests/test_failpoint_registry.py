"""Every step a job runs has named failpoints between its durable writes, each listed in
one registry; the fault tests kill the jobs at every listed point, so a new step (or a
new point) without its entry fails here first."""

from __future__ import annotations

import re
from pathlib import Path

import aiworker
from aiworker.core.scheduling.phase_commands import BUILTIN_PHASES
from aiworker.runtime.failpoints import POINTS

SOURCE = Path(aiworker.__file__).parent
CALL = re.compile(r"""failpoint\((f?)"([^"]+)"\)""")


def calls() -> tuple[set[str], set[str]]:
    """The points named in the code: literal names, and the suffixes of f-string names."""
    literal, suffixes = set(), set()
    for path in SOURCE.rglob("*.py"):
        for is_f, name in CALL.findall(path.read_text()):
            if is_f:
                suffixes.add(name[name.rindex("}") + 1 :])
            else:
                literal.add(name)
    return literal, suffixes


def test_every_step_has_failpoints_in_the_registry():
    assert set(BUILTIN_PHASES) <= set(POINTS), set(BUILTIN_PHASES) - set(POINTS)
    assert all(POINTS.values()), [step for step, points in POINTS.items() if not points]


def test_every_point_in_the_code_is_listed_and_every_listed_point_is_in_the_code():
    literal, suffixes = calls()
    listed = {point for points in POINTS.values() for point in points}
    assert literal <= listed, literal - listed
    unmatched = {p for p in listed if p not in literal and not p.endswith(tuple(suffixes))}
    assert unmatched == set()
    assert suffixes == {".attempt_started", ".after_run", ".after_record"}
