"""How an implementation attempt ends for its task: the report, and the task's last move.

Every move compares against the version the phase itself set when it started
(Running.version); when poll paused the task or an operator cancelled it
meanwhile, the move is refused and that decision stands: the result is
retained, with the reason, instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.phases.guard import PhaseGuard
from aiworker.core.providers.registry import fallbacks
from aiworker.core.report import Report
from aiworker.core.tasks.budgets import RELEASE, land_after_failure
from aiworker.core.tasks.lifecycle import TransitionRefused, advance
from aiworker.core.tasks.notices import comment_on_issue
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE
from aiworker.store.attempts import providers_tried_at
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task

log = logging.getLogger(__name__)


@dataclass
class ImplementReport(Report):
    task: int
    # implemented | ready | failed | needs_input | unavailable | retained | stopped |
    # fell_back (a local model's one try failed; the next provider takes it), or the
    # failure class of a retryable failure
    outcome: str
    provider: str | None = None
    attempt: int | None = None
    base: str | None = None
    head: str | None = None
    gate: dict[str, Any] | None = None
    reason: str = ""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    state: str = ""

    @property
    def exit_code(self) -> int:
        if self.outcome == "implemented":
            return EXIT_OK
        return EXIT_UNAVAILABLE if self.outcome == "unavailable" else EXIT_FAILED


@dataclass
class Running:
    """The task as this phase left it: every later move compares against this version."""

    task: Task
    repo: Repository
    slot: int
    version: int
    token: str  # the claim token this job set: SLOT-pidPID
    state: str = S.RUNNING  # the state the phase holds: running, or repairing for a repair


def land(
    db: Database,
    running: Running,
    to_state: str,
    reason: str,
    *,
    whatever_the_scope: bool = True,
    **changes: Any,
) -> bool:
    """The phase's last move; False when the task moved on meanwhile (its decision stands).
    Only a success depends on the scope it answered (WHATEVER_THE_SCOPE=False): a result
    for a scope poll replaced meanwhile is retained, not accepted."""
    try:
        with db.write() as session:
            running.version = advance(
                session,
                running.task.id,
                running.state,
                running.version,
                to_state,
                reason,
                actor="implement" if running.state == S.RUNNING else "repair",
                follow_data_changes=whatever_the_scope,
                **{**RELEASE, **changes},
            )
    except TransitionRefused:
        return False
    return True


def ended(
    db: Database, running: Running, report: ImplementReport, state: str, outcome: str, reason: str
) -> ImplementReport:
    """End before any attempt started: nothing was spent."""
    land(db, running, state, reason)
    report.outcome, report.reason, report.state = outcome, reason, state
    return report


def needs_input(
    env: Environment,
    db: Database,
    running: Running,
    report: ImplementReport,
    problems: list[str],
    heading: str = "aiworker cannot start on this issue yet; nothing was run. Please fix:",
) -> ImplementReport:
    reason = "; ".join(problems)
    if land(db, running, S.NEEDS_INPUT, reason):
        comment_on_issue(
            env,
            db,
            running.task.id,
            heading
            + "\n"
            + "\n".join(f"- {p}" for p in problems)
            + "\n\nEditing the issue makes it eligible again.",
        )
    report.outcome, report.reason, report.state = "needs_input", reason, S.NEEDS_INPUT
    return report


def failed(
    db: Database, guard: PhaseGuard, running: Running, report: ImplementReport, reason: str
) -> ImplementReport:
    guard.finish("failed", reason)
    if not land(db, running, S.FAILED, reason):
        return retained(db, guard, running, report)
    report.outcome, report.reason, report.state = "failed", reason, S.FAILED
    log.warning("task %d: %s", running.task.id, reason)
    return report


def fell_back(
    env: Environment,
    db: Database,
    guard: PhaseGuard,
    running: Running,
    report: ImplementReport,
    outcome: str,
    reason: str,
    *,
    simple: bool,
) -> ImplementReport:
    """A local model's one try at this snapshot ended without an accepted result (no
    result, over a bound or its diff budget, refused by the gate, questions): the attempt
    is recorded as it ended, and the task goes back to ready for the next provider in
    order, on the same attempt budget. It fails only when no other provider could take
    it, or the budget is spent."""
    guard.finish(outcome, reason[:1000])
    with db.read() as session:
        tried = providers_tried_at(session, running.task.id, report.base or "")
    left = fallbacks(env, "implementation", simple=simple, tried_here=tried)
    why = f"{report.provider}'s local try ended {outcome}: {reason}"
    if not left:
        why += "; no other configured provider can take this issue"
    landed = land_after_failure(
        env,
        db,
        running.task.id,
        running.state,
        running.version,
        "implementation",
        why[:1000],
        retry_state=S.READY if left else S.FAILED,
    )
    report.state = landed or "unchanged"
    # Not landed: the task moved on while the try ran (paused, cancelled); that stands.
    outcomes: dict[str, str] = {S.READY: "fell_back", S.FAILED: "failed"}
    report.outcome = outcomes.get(landed or "", "retained")
    report.reason = why
    log.warning("task %d: %s", running.task.id, why)
    return report


def retained(
    db: Database, guard: PhaseGuard, running: Running, report: ImplementReport
) -> ImplementReport:
    """The task moved on while the phase ran (paused, cancelled): keep the result."""
    with db.read() as session:
        now = session.get(Task, running.task.id)
    state = now.state if now else "gone"
    reason = f"the task became {state} while the phase ran; its result is retained"
    guard.keep(reason)
    if (
        now is not None
        and now.state == running.state == S.RUNNING
        and now.claim_token == running.token
    ):
        # Still ours, but poll recorded a new scope meanwhile: the result answers the old one.
        reason = "the issue changed while the phase ran; its result is retained"
        running.version = now.version
        if land(db, running, S.READY, reason):
            state = S.READY
    report.outcome, report.reason, report.state = "retained", reason, state
    return report


def still_ours(db: Database, running: Running) -> bool:
    """Whether the task is still running as this job left it (not paused, not cancelled)."""
    with db.read() as session:
        now = session.get(Task, running.task.id)
    return now is not None and now.state == running.state and now.claim_token == running.token


def stopped(db: Database, running: Running, report: ImplementReport) -> ImplementReport:
    """The task was paused or cancelled before the provider ran: stop, spending nothing."""
    with db.read() as session:
        now = session.get(Task, running.task.id)
    state = now.state if now else "gone"
    report.outcome, report.state = "stopped", state
    report.reason = f"the task became {state} before the provider ran; nothing was spent"
    return report
