"""What a phase's body hands back: the Outcome.

A body decides; it does not move the task. Its Outcome says where the task goes
(or that it stays), why, what is recorded with the move, how the attempt ended,
and what to comment on the issue once the move is made; the driver
(engine.run_phase) finishes the attempt and makes that one last move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiworker.core.report import Report
from aiworker.core.tasks.repairs import RepairRequest


@dataclass
class Outcome:
    report: Report
    state: str | None = None  # where the task goes; None: it stays as it is
    reason: str = ""
    changes: dict[str, Any] = field(default_factory=dict)  # recorded on the task with the move
    kind: str = "task.transition"  # the move's event
    actor: str | None = None  # who the move's event names; the phase's command if None
    data: dict[str, Any] | None = None
    # The move answers the scope the body read (an accepted implementation, publish, the
    # plan step's moves): a scope poll recorded meanwhile refuses it. Any other move (a
    # failure, a step's recorded result) follows a new scope.
    scoped: bool = False
    comment: str | None = None  # commented on the issue once the move is made
    writes: Callable[[Any], None] | None = None  # more writes in the move's transaction
    repair: RepairRequest | None = None  # instead of a move: ask for a repair episode
    retry: str | None = None  # a failure: this state while the budget lasts, else failed
    attempt: str | None = None  # how the attempt ended, recorded before the move
    attempt_reason: str = ""
    refunded: bool = False
    follow_up: bool = True  # it made progress: the caller asks for a check now

    def ended(self, attempt: str, reason: str = "", *, refunded: bool = False) -> Outcome:
        self.attempt, self.attempt_reason, self.refunded = attempt, reason[:1000], refunded
        return self
