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


def open_attempts_before(session: Executor, before: datetime, host: str | None) -> list[int]:
    """The tasks of HOST's open attempts (None: of no controller) that started at or
    before BEFORE."""
    found = session.scalars(
        select(attempts.c.task_id).where(
            attempts.c.finished_at.is_(None),
            attempts.c.host.is_not_distinct_from(host),
            attempts.c.started_at <= before,
        )
    )
    return sorted(set(found))


def clock_start(session: Executor, task_id: int, restarts: Collection[str]) -> datetime | None:
    """The start of TASK_ID's first charged attempt since it, or the plan it is a
    milestone of, last left one of RESTARTS (a person's hands: waiting for input or an
    approval, paused, failed and retried); None when none has started since. A refunded
    attempt (a quota failure) spent nothing and starts no clock."""
    parent = session.scalar(select(tasks.c.parent_id).where(tasks.c.id == task_id))
    handed_back = session.scalar(
        select(func.max(events.c.created_at)).where(
            events.c.task_id.in_([task_id] if parent is None else [task_id, parent]),
            events.c.from_state.in_(restarts),
            events.c.to_state.not_in(restarts),
        )
    )
    first = select(func.min(attempts.c.started_at)).where(
        attempts.c.task_id == task_id, attempts.c.refunded.is_(False)
    )
    if handed_back is not None:
        first = first.where(attempts.c.started_at >= handed_back)
    started: datetime | None = session.scalar(first)
    return started


def is_idle(session: Executor, task_id: int) -> bool:
    """No attempt of TASK_ID is open and no slot holds it."""
    open_attempt = exists().where(attempts.c.task_id == task_id, attempts.c.finished_at.is_(None))
    held = session.scalar(
        select(tasks.c.id).where(tasks.c.id == task_id, tasks.c.claim_slot.is_(None), ~open_attempt)
    )
    return held is not None


def overdue(
    session: Executor,
    states: Collection[str],
    restarts: Collection[str],
    now: datetime,
    seconds: int,
    running_plan: str,
) -> list[tuple[int, str, int, datetime]]:
    """(id, state, version, clock start) of the tasks in STATES, held by no slot and with
    no attempt open, whose clock started SECONDS or more before NOW. A milestone counts
    only while its plan runs its milestones (else the plan waits for a person)."""
    plans = tasks.alias("plans")
    idle = session.execute(
        select(tasks.c.id, tasks.c.state, tasks.c.version)
        .outerjoin(plans, plans.c.id == tasks.c.parent_id)
        .where(
            tasks.c.state.in_(states),
            tasks.c.claim_slot.is_(None),
            (tasks.c.parent_id.is_(None)) | (plans.c.state == running_plan),
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
