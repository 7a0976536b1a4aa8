"""Task state on Core tables. Every state change is a compare-and-update plus an event
on `version` (claims, on `state` in one statement, are in claims.py).

Nothing here builds ORM objects (task_records.py does), so the scheduler tick
and the claim path never configure the mappers. Transitions run on the driver
cursor (driver.py): with claims, they are the hottest writes in the system.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from aiworker.store.driver import DriverConnection, DriverStatement, driver_of
from aiworker.store.tables import attempts, events, tasks, utcnow

TASK_KINDS = ("plan", "milestone", "feature", "issue")
# The vocabulary of core/tasks/states.py (a test keeps the two equal); which state may
# follow which is decided there, never here.
TASK_STATES = (
    "new",
    "ready",
    "claimed",
    "running",
    "planning",
    "awaiting_plan_approval",
    "milestones",
    "implemented",
    "awaiting_ci",
    "awaiting_review",
    "repairing",
    "approved",
    "needs_input",
    "paused",
    "done",
    "failed",
    "cancelled",
)
# A milestone in one of these states keeps its plan's next milestone waiting.
IN_FLIGHT = ("claimed", "running", "repairing", "awaiting_ci", "awaiting_review")
# Columns a transition may change besides state; version and timestamps are ours.
_MUTABLE = frozenset(
    {
        "title",
        "scope_fingerprint",
        "base_commit",
        "head_commit",
        "claim_slot",
        "claim_token",
        "claim_host",
        "claimed_at",
        "spec",
    }
)
EVENT_COLUMNS = ("task_id", "kind", "from_state", "to_state", "actor", "data", "created_at")
INSERT_EVENT = DriverStatement(insert(events), column_keys=EVENT_COLUMNS)
_STATE_OF = DriverStatement(
    select(tasks.c.state, tasks.c.version).where(tasks.c.id == bindparam("task_id"))
)

# Queries take an ORM session or a bare connection (Database.transaction()); state changes
# and claims also take the driver connection of Database.driver_transaction().
Executor = Session | Connection
Writer = Session | Connection | DriverConnection


def connection_of(target: Executor) -> Connection:
    return target.connection() if isinstance(target, Session) else target


def _driver(target: Writer) -> DriverConnection:
    return target if isinstance(target, DriverConnection) else driver_of(connection_of(target))


STOP_REQUESTED = "slot.stop_requested"


def stop_requested(session: Session, task_id: int, pid: int) -> str | None:
    """Why an operator asked for process PID, a job of TASK_ID, to stop; None if none did."""
    rows = session.execute(
        select(events.c.data).where(events.c.task_id == task_id, events.c.kind == STOP_REQUESTED)
    )
    asked = [data for (data,) in rows if isinstance(data, dict) and data.get("pid") == pid]
    return str(asked[-1].get("reason", "stopped by an operator")) if asked else None


def append_event(
    session: Writer,
    kind: str,
    *,
    task_id: int | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    actor: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> None:
    INSERT_EVENT.execute(
        _driver(session),
        {
            "task_id": task_id,
            "kind": kind,
            "from_state": from_state,
            "to_state": to_state,
            "actor": actor,
            "data": dict(data or {}),
            "created_at": utcnow(),
        },
    )


@functools.cache
def _transition_statement(columns: tuple[str, ...]) -> DriverStatement:
    """One prebuilt compare-and-update per set of changed columns (built once, reused)."""
    values: dict[str, Any] = {name: bindparam(f"new_{name}") for name in columns}
    statement = (
        update(tasks)
        .where(
            tasks.c.id == bindparam("task_id"),
            tasks.c.version == bindparam("expected_version"),
            tasks.c.state == bindparam("from_state"),
        )
        .values(
            state=bindparam("to_state"),
            version=tasks.c.version + 1,
            updated_at=bindparam("now"),
            **values,
        )
    )
    return DriverStatement(statement)


def compare_and_update(
    session: Writer,
    task_id: int,
    expected_version: int,
    from_state: str,
    to_state: str,
    *,
    actor: str | None = None,
    kind: str = "task.transition",
    data: Mapping[str, Any] | None = None,
    **changes: Any,
) -> bool:
    """Move a task from FROM_STATE at EXPECTED_VERSION to TO_STATE.

    Returns False, changing nothing, when another writer got there first: the
    caller must re-read and decide again. Only core.tasks.lifecycle.advance() calls
    this (it checks the edge table first); claims below are the one hard-wired edge,
    ready -> claimed.
    """
    if to_state not in TASK_STATES:
        raise ValueError(f"unknown task state {to_state!r}")
    unknown = set(changes) - _MUTABLE
    if unknown:
        raise ValueError(f"transition cannot set {sorted(unknown)}")
    columns = tuple(sorted(changes))
    params = {f"new_{name}": changes[name] for name in columns}
    driver = _driver(session)
    cursor = _transition_statement(columns).execute(
        driver,
        {
            "task_id": task_id,
            "expected_version": expected_version,
            "from_state": from_state,
            "to_state": to_state,
            "now": utcnow(),
            **params,
        },
    )
    if cursor.rowcount != 1:
        return False
    append_event(
        driver,
        kind,
        task_id=task_id,
        from_state=from_state,
        to_state=to_state,
        actor=actor,
        data=data,
    )
    return True


def claim(
    session: Writer,
    task_id: int,
    expected_version: int,
    slot: int,
    holder_token: str,
    *,
    now: datetime | None = None,
) -> bool:
    """Claim a ready task for SLOT; False when someone else changed it first."""
    return compare_and_update(
        session,
        task_id,
        expected_version,
        "ready",
        "claimed",
        actor=f"slot-{slot}",
        kind="task.claimed",
        data={"slot": slot, "holder": holder_token},
        claim_slot=slot,
        claim_token=holder_token,
        claimed_at=now or utcnow(),
    )


def task_state(session: Writer, task_id: int) -> tuple[str, int] | None:
    """(state, version) of TASK_ID as this transaction sees it."""
    row = _STATE_OF.execute(_driver(session), {"task_id": task_id}).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def tasks_in_states(session: Executor, states: Sequence[str]) -> list[tuple[int, str, str]]:
    """(id, state, kind) of every task in STATES, by id."""
    rows = connection_of(session).execute(
        select(tasks.c.id, tasks.c.state, tasks.c.kind)
        .where(tasks.c.state.in_(list(states)))
        .order_by(tasks.c.id)
    )
    return [(int(task_id), str(state), str(kind)) for task_id, state, kind in rows]


def states_of(session: Executor, task_ids: Sequence[int]) -> dict[int, tuple[str, datetime]]:
    """State and last change of each of TASK_IDS that exists."""
    rows = connection_of(session).execute(
        select(tasks.c.id, tasks.c.state, tasks.c.updated_at).where(tasks.c.id.in_(task_ids))
    )
    return {int(i): (str(s), u) for i, s, u in rows}


def prune_events(session: Executor, kind: str, keep: int) -> int:
    """Delete all but the latest KEEP events of KIND (scheduler checks, never task history)."""
    connection = connection_of(session)
    cutoff = connection.scalar(
        select(events.c.id)
        .where(events.c.kind == kind)
        .order_by(events.c.id.desc())
        .offset(keep)
        .limit(1)
    )
    if cutoff is None:
        return 0
    deleted = connection.execute(
        delete(events).where(
            events.c.kind == kind, events.c.id <= cutoff, events.c.task_id.is_(None)
        )
    )
    return int(deleted.rowcount)


def has_open_attempts(session: Executor) -> bool:
    """Whether any attempt is still open (a running job, or one a dead job left)."""
    found = connection_of(session).scalar(
        select(attempts.c.id).where(attempts.c.finished_at.is_(None)).limit(1)
    )
    return found is not None


def open_attempt_jobs(session: Executor) -> list[tuple[int, int, int | None, str | None]]:
    """Each open attempt as (its id, its task, its job's pid, its controller), read on
    the schema of any version a migration starts from (one older than an attempt's pid
    or controller gives None for it)."""
    from sqlalchemy import inspect, null

    connection = connection_of(session)
    have = {column["name"] for column in inspect(connection).get_columns("attempts")}
    pid, host = (attempts.c[n] if n in have else null() for n in ("pid", "host"))
    rows = connection.execute(
        select(attempts.c.id, attempts.c.task_id, pid, host).where(attempts.c.finished_at.is_(None))
    ).all()
    return [(int(r[0]), int(r[1]), r[2], r[3]) for r in rows]


def kind_and_state(session: Executor, task_id: int) -> tuple[str, str] | None:
    row = (
        connection_of(session)
        .execute(select(tasks.c.kind, tasks.c.state).where(tasks.c.id == task_id))
        .first()
    )
    return None if row is None else (str(row[0]), str(row[1]))


def count_by_state(session: Executor) -> dict[str, int]:
    rows = connection_of(session).execute(
        select(tasks.c.state, func.count()).group_by(tasks.c.state)
    )
    return {str(state): int(count) for state, count in rows}
