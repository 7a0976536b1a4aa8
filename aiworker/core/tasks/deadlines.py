"""Task deadlines (`deadlines.task`, default 24 h): no task works without end.

A task's clock starts with its first attempt, and starts again when a person hands the
task back (an answer to its questions, an approval, a resume, a retry): time in a
person's hands never counts. A provider run never outlasts what is left of the
deadline (nor its phase's own limit, `deadlines.PHASE`), so the work in flight stops at
the deadline with what it wrote kept; the tick then ends every idle task past its
deadline as failed, with the reason and its attempts commented on the issue. A task
whose job still runs is left to that job, bounded as above, and ended after it; a job
still running `deadlines.stuck` after the deadline hangs somewhere, and is stopped.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.tasks.budgets import attempts_summary
from aiworker.core.tasks.lifecycle import Refusal, try_advance
from aiworker.core.tasks.notices import comment_on_issue
from aiworker.core.tasks.operator import stop_jobs
from aiworker.core.tasks.states import AWAITING_WORK
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import Conflict
from aiworker.store.deadlines import clock_start, is_idle, open_attempts_before, overdue
from aiworker.store.engine import Database
from aiworker.store.task_records import existing_task

log = logging.getLogger(__name__)
# Where a task waits for a person; leaving one starts the clock anew (failed: a retry).
RESTARTS = frozenset({S.NEEDS_INPUT, S.AWAITING_PLAN_APPROVAL, S.PAUSED, S.FAILED})


class DeadlinePassed(Conflict):
    code = "deadline_passed"


def _hours(seconds: int) -> str:
    return f"{seconds / 3600:g} h"


def remaining_s(env: Environment, db: Database, task_id: int) -> float | None:
    """Seconds left before TASK_ID's deadline (its clock started by now), or None when
    deadlines are off."""
    seconds = env.loaded.config.deadlines.task
    if seconds <= 0:
        return None
    with db.read() as session:
        start = clock_start(session, task_id, RESTARTS)
    now = datetime.now(UTC)
    end = (start or now) + timedelta(seconds=seconds)
    return (end - now).total_seconds()


def run_limit_s(env: Environment, db: Database, task_id: int, phase: str) -> float:
    """How long a provider run of PHASE may take now: its phase's limit, within what is
    left of the task's deadline. Raises DeadlinePassed when nothing is left."""
    limit = float(env.loaded.config.deadlines.run_limit(phase))
    left = remaining_s(env, db, task_id)
    if left is None:
        return limit
    if left <= 0:
        raise DeadlinePassed(
            f"task {task_id}: its deadline ({_hours(env.loaded.config.deadlines.task)} from "
            "its start) has passed; the tick ends it"
        )
    return min(limit, left)


def _fail(
    env: Environment, db: Database, seen: tuple[int, str, int], reason: str, data: dict[str, Any]
) -> bool:
    """Fail the task as SEEN (id, state, version) under its own lock (a delivery step holds
    it while it runs), only while no slot holds it and no attempt of it is open."""
    task_id, state, version = seen
    lock = env.locks.lock(f"task-{task_id}")
    if not lock.try_acquire():
        return False
    try:
        with db.write() as session:
            if not is_idle(session, task_id):
                return False
            moved = try_advance(
                session,
                task_id,
                state,
                version,
                S.FAILED,
                reason,
                actor="deadline",
                kind="task.failed",
                data=data,
            )
    finally:
        lock.release()
    return not isinstance(moved, Refusal)


def stop_stuck(env: Environment, db: Database) -> list[dict[str, Any]]:
    """Stop this host's jobs still running `deadlines.stuck` past their task's deadline:
    their provider run ended at the deadline, so such a job hangs somewhere, and its
    heartbeat keeps recovery from it for ever. Its guard lands the task (or, when it does
    not end within the stop's grace, recovery closes what it left), and end_overdue then
    ends the task for its deadline; what each was."""
    limits = env.loaded.config.deadlines
    now = datetime.now(UTC)
    with db.read() as session:
        running = open_attempts_before(session, now - timedelta(seconds=limits.stuck), db.host)
        late = {
            task_id: start
            for task_id in running
            if (start := clock_start(session, task_id, RESTARTS)) is not None
            and start + timedelta(seconds=limits.task + limits.stuck) <= now
        }
    stopped = []
    for task_id, start in late.items():
        reason = (
            f"its job still ran {limits.stuck} s after its deadline ({_hours(limits.task)} "
            f"from its start at {start.isoformat(timespec='seconds')}), so it was stopped"
        )
        with db.read() as session:
            task = existing_task(session, task_id)
        pids = stop_jobs(env, db, task, reason)
        if pids:  # else it ended meanwhile
            log.warning("task %d: %s", task_id, reason)
            stopped.append({"task": task_id, "pids": pids, "reason": reason})
    return stopped


def end_overdue(env: Environment, db: Database) -> list[dict[str, Any]]:
    """End every idle task past its deadline as failed, commenting why; what each was."""
    seconds = env.loaded.config.deadlines.task
    if seconds <= 0:
        return []
    now = datetime.now(UTC)
    with db.read() as session:
        late = overdue(session, AWAITING_WORK, RESTARTS, now, seconds, S.MILESTONES)
    ended = []
    for task_id, state, version, start in late:
        reason = (
            f"its deadline passed: {_hours(seconds)} from its start at "
            f"{start.isoformat(timespec='seconds')} (deadlines.task)"
        )
        if not _fail(env, db, (task_id, state, version), reason, {"deadline_s": seconds}):
            continue  # a job took it up meanwhile: the next tick looks again
        log.warning("task %d: %s", task_id, reason)
        comment_on_issue(
            env,
            db,
            task_id,
            f"aiworker stopped working on this: {reason}. What it made is kept.\n\n"
            f"Attempts:\n{attempts_summary(db, task_id)}\n\n"
            "An operator can run `aiworker task retry` to give it a new deadline.",
        )
        ended.append({"task": task_id, "from": state, "reason": reason})
    return ended
