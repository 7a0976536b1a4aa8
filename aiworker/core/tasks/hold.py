"""Holding a task for an operator, and `aiworker task resume`.

A task held (a restore could not verify it against the forge) stays paused with its
reason until an operator resumes it: a poll that finds its issue authorised does not
take it back, as it does for a task paused when its authorisation was withdrawn.
Resuming returns it to the state it was paused in where every step re-verifies what
it relies on (work past implementation, a plan past planning, a repair), else to
ready."""

from __future__ import annotations

from dataclasses import dataclass

from aiworker.core.context import Environment
from aiworker.core.report import Report
from aiworker.core.tasks.budgets import RELEASE
from aiworker.core.tasks.lifecycle import Refusal, advance, try_advance
from aiworker.core.tasks.states import RESUMABLE, TaskState
from aiworker.errors import Conflict
from aiworker.store.engine import Database
from aiworker.store.task_records import existing_task, paused_from


@dataclass
class ResumeReport(Report):
    task: int
    state: str
    was: str


def hold_task(
    db: Database, task_id: int, state: str, version: int, reason: str, actor: str
) -> bool:
    """Pause TASK_ID (in STATE at VERSION) until an operator resumes it; its claim goes.
    False when the task moved on meanwhile: it is left as it is."""
    with db.write() as session:
        held = try_advance(
            session,
            task_id,
            state,
            version,
            TaskState.PAUSED,
            reason,
            actor=actor,
            kind="task.held",
            **RELEASE,
        )
    return not isinstance(held, Refusal)


def resume_task(env: Environment, task_id: int) -> ResumeReport:
    db = env.open_database()
    try:
        with db.write() as session:
            task = existing_task(session, task_id)
            if task.state != TaskState.PAUSED:
                raise Conflict(f"task {task_id} is {task.state}; only a paused task is resumed")
            before = paused_from(session, task_id)
            to_state = TaskState(before) if before in RESUMABLE else TaskState.READY
            advance(
                session,
                task_id,
                task.state,
                task.version,
                to_state,
                "resumed by an operator",
                actor="operator",
                kind="task.resumed_by_operator",  # not an authorisation: see AUTHORIZING
            )
        return ResumeReport(task_id, to_state, TaskState.PAUSED)
    finally:
        db.dispose()
