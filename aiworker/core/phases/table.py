"""Every unit of work the tick starts, declared once.

A declaration says what the unit is called (its budget, its attempts' phase and its
events), the command the launcher runs, the states it starts from, the state it holds
while it runs, where a retryable failure or an abandoned attempt lands, which lock it
takes, whether it runs a provider in a workspace, its body, and what recovery does for
an attempt of it that died. The driver (engine.run_phase), the scheduler's commands,
the launcher, recovery and budgets all read it here; nothing else decides by a phase's
name. Bodies are named as `module:function` and loaded when the unit runs, so that this
table stays below everything that reads it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiworker.core.tasks.states import TaskState as S

SLOT, TASK = "slot", "task"
# Every kind of task; delivery steps serve the kinds that are published (a milestone is
# accepted into its plan's branch by the plan's step instead).
PUBLISHED = frozenset({"issue", "feature", "plan"})


@dataclass(frozen=True)
class Phase:
    name: str  # its budget, its attempts' phase and the prefix of its failpoints
    command: str  # `aiworker COMMAND --task ID` (slot phases add `--slot N`)
    starts: frozenset[str]  # the states it may start from
    holds: str | None  # the state it holds while it runs; None: the one it started from
    retry: str | None  # where a retryable failure lands; None: the one it started from
    lock: str  # SLOT (slot-N.lock, a claim) or TASK (task-N.lock)
    body: str  # module:function, called with the job; returns an Outcome
    kinds: frozenset[str]  # the kinds of task it serves
    backend: bool = False  # it runs a provider in a workspace of an execution backend
    needs: str = ""  # "pr": an open pull request of the task; "head": an implemented head
    abandoned: str = ""  # module:function recovery calls for an attempt of it that died
    doing: str = ""  # a slot phase's take-up, as its event says: "implementing on slot 1"

    def run(self) -> Callable[..., Any]:
        return load(self.body)


PLAN = Phase(
    "planning",
    "plan",
    frozenset({S.CLAIMED}),
    S.PLANNING,
    S.READY,
    SLOT,
    "aiworker.core.phases.plan:plan",
    frozenset({"plan"}),
    backend=True,
    doing="planning",
)
IMPLEMENT = Phase(
    "implementation",
    "implement",
    frozenset({S.CLAIMED}),
    S.RUNNING,
    S.READY,
    SLOT,
    "aiworker.core.phases.implement:implement",
    frozenset({"issue", "feature", "milestone"}),
    backend=True,
    doing="implementing",
)
REPAIR = Phase(
    "repair",
    "repair",
    frozenset({S.REPAIRING}),
    S.REPAIRING,
    S.REPAIRING,
    SLOT,
    "aiworker.core.phases.repair:repair",
    frozenset({"issue", "feature", "plan", "milestone"}),
    backend=True,
    doing="repairing",
)
PUBLISH = Phase(
    "publish",
    "publish",
    frozenset({S.IMPLEMENTED}),
    None,
    None,
    TASK,
    "aiworker.core.delivery.publish:publish",
    PUBLISHED,
    needs="head",
)
CI = Phase(
    "ci",
    "ci",
    frozenset({S.AWAITING_CI}),
    None,
    None,
    TASK,
    "aiworker.core.delivery.ci:ci",
    PUBLISHED,
    needs="pr",
    abandoned="aiworker.core.delivery.ci:abandoned",  # its pending status gets an error
)
REVIEW = Phase(
    "review",
    "review",
    frozenset({S.AWAITING_REVIEW}),
    None,
    None,
    TASK,
    "aiworker.core.phases.review:review",
    PUBLISHED,
    backend=True,
    needs="pr",
)
MERGE = Phase(
    "merge",
    "merge",
    frozenset({S.APPROVED}),
    None,
    None,
    TASK,
    "aiworker.core.delivery.merge:merge",
    PUBLISHED,
    needs="pr",
)
# The plan's step: its approval, its milestones one at a time, its combined checks.
MILESTONES = Phase(
    "milestones",
    "milestones",
    frozenset({S.AWAITING_PLAN_APPROVAL, S.MILESTONES}),
    None,
    None,
    TASK,
    "aiworker.core.delivery.milestones:milestones",
    frozenset({"plan"}),
)
PHASES: tuple[Phase, ...] = (PLAN, IMPLEMENT, REPAIR, PUBLISH, CI, REVIEW, MERGE, MILESTONES)
COMMANDS: dict[str, Phase] = {p.command: p for p in PHASES}
NAMES: dict[str, Phase] = {p.name: p for p in PHASES}


def slot_phase(kind: str, state: str) -> Phase | None:
    """The slot phase that a task of KIND claimed in STATE runs (a claim of a repairing
    task is a repair episode); None when no slot phase serves it."""
    for phase in PHASES:
        if phase.lock == SLOT and state in phase.starts and kind in phase.kinds:
            return phase
    return None


def held_by(state: str, kind: str) -> Phase:
    """The slot phase whose claim holds a task of KIND in STATE (claimed, or the state the
    phase holds while it runs)."""
    for phase in PHASES:
        if phase.lock == SLOT and kind in phase.kinds and state in (*phase.starts, phase.holds):
            return phase
    raise LookupError(f"no slot phase holds a {kind} task that is {state}")


def step_for(kind: str, state: str) -> Phase | None:
    """The step (under the task's own lock) that a task of KIND in STATE waits on."""
    for phase in PHASES:
        if phase.lock == TASK and state in phase.starts and kind in phase.kinds:
            return phase
    return None


def step_states() -> list[str]:
    """Every state some step starts from."""
    return sorted({state for p in PHASES if p.lock == TASK for state in p.starts})


def claimable_kinds() -> dict[str, Phase]:
    """Each kind of task that is claimed from ready, and the slot phase it runs."""
    return {
        kind: phase
        for phase in PHASES
        if phase.lock == SLOT and S.CLAIMED in phase.starts
        for kind in sorted(phase.kinds)
    }


def load(path: str) -> Callable[..., Any]:
    """The function PATH (module:function) names."""
    module, _, name = path.partition(":")
    found: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return found
