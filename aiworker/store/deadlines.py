"""What a task's deadline is read from: when its clock started (its first attempt since a
person last handed it over) and which waiting tasks have run past theirs. Core queries
only: the tick asks the first question every time, without the ORM."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from sqlalchemy import exists, func, select

from aiworker.store.tables import attempts, events, tasks
from aiworker.store.tasks import Executor


def work_started_before(session: Executor, before: datetime, states: Collection[str]) -> bool:
    """Whether a task in STATES has an attempt that started at or before BEFORE."""
    found = session.execute(
        select(attempts.c.id)
        .join(tasks, tasks.c.id == attempts.c.task_id)
        .where(tasks.c.state.in_(states), attempts.c.started_at <= before)
        .limit(1)
    )
    return found.first() is not None


def clock_start(session: Executor, task_id: int, restarts: Collection[str]) -> datetime | None:
    """The start of TASK_ID's first attempt since it last left one of RESTARTS (a person's
    hands: waiting for input or an approval, paused, failed and retried); None when no
    attempt has started since."""
    handed_back = session.scalar(
        select(func.max(events.c.created_at)).where(
            events.c.task_id == task_id,
            events.c.from_state.in_(restarts),
            events.c.to_state.not_in(restarts),
        )
    )
    first = select(func.min(attempts.c.started_at)).where(attempts.c.task_id == task_id)
    if handed_back is not None:
        first = first.where(attempts.c.started_at >= handed_back)
    started: datetime | None = session.scalar(first)
    return started


def overdue(
    session: Executor,
    states: Collection[str],
    restarts: Collection[str],
    now: datetime,
    seconds: int,
) -> list[tuple[int, str, int, datetime]]:
    """(id, state, version, clock start) of the tasks in STATES with no attempt open whose
    clock started SECONDS or more before NOW."""
    idle = session.execute(
        select(tasks.c.id, tasks.c.state, tasks.c.version)
        .where(
            tasks.c.state.in_(states),
            ~exists().where(attempts.c.task_id == tasks.c.id, attempts.c.finished_at.is_(None)),
        )
        .order_by(tasks.c.id)
    ).all()
    found = []
    for task_id, state, version in idle:
        start = clock_start(session, task_id, restarts)
        if start is not None and start + timedelta(seconds=seconds) <= now:
            found.append((task_id, state, version, start))
    return found
