"""What a phase's body is handed (the Job) and what it hands back (the Outcome).

A body decides; it does not move the task. Its Outcome says where the task goes
(or that it stays), why, what is recorded with the move, how the attempt ended,
and what to comment on the issue once the move is made; the driver
(engine.run_phase) finishes the attempt and makes that one last move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.phases.guard import PhaseGuard
from aiworker.core.phases.table import Phase
from aiworker.core.report import Report
from aiworker.core.tasks.repairs import RepairRequest
from aiworker.runtime.failpoints import failpoint
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task


@dataclass
class Job:
    """One run of one phase for one task, as the driver took it up."""

    env: Environment
    db: Database
    phase: Phase
    task: Task  # as loaded; task.version is the version this job set
    repo: Repository
    started: str  # the state it started from
    slot: int | None = None
    token: str | None = None  # the claim token a slot phase set: SLOT-pidPID
    pr: int | None = None  # the task's open pull request, for a step that needs one
    guard: PhaseGuard | None = None
    report: Report | None = None  # the body's report, once it made one
    failure_hook: Callable[[str], None] | None = None  # run with the reason if the body fails

    @property
    def holds(self) -> str:
        """The state the task is in while the job runs: its phase's, or for a step the
        state it is in now (the plan step moves its plan on as it goes)."""
        return self.phase.holds or str(self.task.state)

    @property
    def retry(self) -> str:
        """Where a retryable failure lands: its phase's, or a step's state now."""
        return self.phase.retry or self.holds

    def start(
        self,
        provider: str | None = None,
        settings: dict[str, object] | None = None,
        model: str | None = None,
        effort: str | None = None,
    ) -> int:
        """Record the attempt (charged to the phase's budget) and pass its failpoint."""
        assert self.guard is not None
        attempt = self.guard.start(provider, settings or {}, model, effort)
        failpoint(f"{self.phase.name}.attempt_started")
        return attempt

    def now(self) -> Task | None:
        """The task as it is recorded now."""
        with self.db.read() as session:
            return session.get(Task, self.task.id)


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


def landed(report: Report, state: str, refusal: str | None) -> None:
    """Tell REPORT where the task is after the move (REFUSAL: why the move was refused)."""
    hook = getattr(report, "landed", None)
    if hook is not None:
        hook(state, refusal)
    elif hasattr(report, "state"):
        report.state = state
