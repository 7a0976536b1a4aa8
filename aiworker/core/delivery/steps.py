"""Every delivery step (publish, ci, merge) runs as a guarded attempt of its own.

The step is recorded as an attempt (no provider) charged to the task's budget
for that step, so a step that keeps failing or dying ends the task as failed
with a comment instead of being restarted on every tick; a failure of something
outside (the forge unavailable) is refunded. The task stays in the state the
step started from while the budget lasts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from aiworker.core.context import Environment
from aiworker.core.phases.guard import PhaseGuard
from aiworker.core.tasks.budgets import budget_spent, land_after_failure
from aiworker.core.tasks.hosts import hold_task_lock
from aiworker.errors import Conflict
from aiworker.runtime.failpoints import failpoint
from aiworker.store.engine import Database
from aiworker.store.models import Task
from aiworker.store.tasks import append_event


class StepBudgetSpent(Conflict):
    code = "budget_spent"


def step_guard(
    env: Environment,
    db: Database,
    task: Task,
    step: str,
    settings: dict[str, object],
    on_failure: Callable[[str], None] | None = None,
) -> PhaseGuard:
    """A started guard for STEP of TASK (which stays in its current state on a failure
    while the budget lasts). ON_FAILURE runs first (CI posts its terminal status)."""
    lock = hold_task_lock(env, db, task.id, task.state, task.version)
    state, version = task.state, task.version

    def recover(reason: str) -> None:
        if on_failure is not None:
            on_failure(reason)
        land_after_failure(env, db, task.id, state, version, step, reason, retry_state=state)

    guard = PhaseGuard(db, task.id, step, recover, lock=lock)
    exhausted = budget_spent(env, db, task.id, step)
    if exhausted:
        recover(exhausted)
        if lock is not None:
            lock.release()
        raise StepBudgetSpent(f"task {task.id}: the {step} budget is spent")
    guard.start(None, settings)
    failpoint(f"{step}.attempt_started")
    return guard


def refuse_publication(db: Database, task: Task, reason: str) -> NoReturn:
    """Publication does not go ahead: the reason is recorded, and the step fails with it."""
    with db.write() as session:
        append_event(session, "publish.refused", task_id=task.id, data={"reason": reason})
    raise Conflict(f"task {task.id} cannot be published: {reason}")
