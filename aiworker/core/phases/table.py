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
PUBLISHED = ("issue", "feature", "plan")


@dataclass(frozen=True)
class Phase:
    name: str  # its budget, its attempts' phase and the prefix of its failpoints
    command: str  # `aiworker COMMAND --task ID` (slot phases add `--slot N`)
    body: str  # module:function below aiworker.core, called with the job; returns an Outcome
    starts: tuple[str, ...]  # the states it may start from
    kinds: tuple[str, ...] = PUBLISHED  # the kinds of task it serves
    lock: str = TASK  # SLOT (slot-N.lock, a claim) or TASK (task-N.lock)
    holds: str | None = None  # the state it holds while it runs; None: the one it started in
    retry: str | None = None  # where a retryable failure lands; None: the one it started in
    doing: str = ""  # a slot phase's take-up, as its event says: "implementing on slot 1"
    backend: bool = False  # it runs a provider in a workspace of an execution backend
    needs: str = ""  # "pr": an open pull request of the task; "head": an implemented head
    abandoned: str = ""  # module:function recovery calls for an attempt of it that died

    def run(self) -> Callable[..., Any]:
        return load(self.body)


# A table: one declaration a row (ruff would give each field a line of its own).
# fmt: off
# The slot phases: a provider's run on a claimed slot.
PLAN = Phase("planning", "plan", "phases.plan:plan", (S.CLAIMED,), ("plan",),
             SLOT, S.PLANNING, S.READY, "planning", backend=True)
IMPLEMENT = Phase("implementation", "implement", "phases.implement:implement", (S.CLAIMED,),
                  ("issue", "feature", "milestone"),
                  SLOT, S.RUNNING, S.READY, "implementing", backend=True)
REPAIR = Phase("repair", "repair", "phases.repair:repair", (S.REPAIRING,),
               (*PUBLISHED, "milestone"),
               SLOT, S.REPAIRING, S.REPAIRING, "repairing", backend=True)
# The steps, under the task's own lock.
PUBLISH = Phase("publish", "publish", "delivery.publish:publish", (S.IMPLEMENTED,), needs="head")
CI = Phase("ci", "ci", "delivery.ci:ci", (S.AWAITING_CI,), needs="pr",
           abandoned="delivery.ci:abandoned")  # its pending status gets an error
REVIEW = Phase("review", "review", "phases.review:review", (S.AWAITING_REVIEW,), needs="pr",
               backend=True)
MERGE = Phase("merge", "merge", "delivery.merge:merge", (S.APPROVED,), needs="pr")
# The plan's step: its approval, its milestones one at a time, its combined checks.
MILESTONES = Phase("milestones", "milestones", "delivery.milestones:milestones",
                   (S.AWAITING_PLAN_APPROVAL, S.MILESTONES), ("plan",))
# fmt: on
PHASES: tuple[Phase, ...] = (PLAN, IMPLEMENT, REPAIR, PUBLISH, CI, REVIEW, MERGE, MILESTONES)
COMMANDS: dict[str, Phase] = {p.command: p for p in PHASES}
NAMES: dict[str, Phase] = {p.name: p for p in PHASES}


def starting(lock: str, kind: str, state: str) -> Phase | None:
    """The phase under LOCK that a task of KIND in STATE starts: SLOT, the one a claim
    runs (a claim of a repairing task is a repair episode); TASK, the step it waits on."""
    found = (p for p in PHASES if p.lock == lock and state in p.starts and kind in p.kinds)
    return next(found, None)


def held_by(state: str, kind: str) -> Phase:
    """The slot phase whose claim holds a task of KIND in STATE (claimed, or the state the
    phase holds while it runs)."""
    for phase in PHASES:
        if phase.lock == SLOT and kind in phase.kinds and state in (*phase.starts, phase.holds):
            return phase
    raise LookupError(f"no slot phase holds a {kind} task that is {state}")


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
    """The function PATH (module:function, below aiworker.core) names."""
    module, _, name = path.partition(":")
    found: Callable[..., Any] = getattr(importlib.import_module(f"aiworker.core.{module}"), name)
    return found
