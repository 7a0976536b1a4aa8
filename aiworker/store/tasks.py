"""Task state on Core tables. Every state change is a compare-and-update plus an event:
on `version` for a transition, on `state` under the write lock for a claim.

Nothing here builds ORM objects (task_records.py does), so the scheduler tick
and the claim path never configure the mappers. The claim's statements run on
the driver cursor (driver.py): they are the hottest writes in the system.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, bindparam, case, delete, func, insert, select, update
from sqlalchemy import literal_column as sql_literal
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from aiworker.store.driver import DriverConnection, DriverStatement, driver_of
from aiworker.store.engine import Database
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
        "claimed_at",
        "spec",
    }
)
_EVENT_COLUMNS = ("task_id", "kind", "from_state", "to_state", "actor", "data", "created_at")
_INSERT_EVENT = DriverStatement(insert(events), column_keys=_EVENT_COLUMNS)
_STATE_OF = DriverStatement(
    select(tasks.c.state, tasks.c.version).where(tasks.c.id == bindparam("task_id"))
)

# Queries take an ORM session or a bare connection (Database.transaction()); state changes
# and claims also take the driver connection of Database.driver_transaction().
Executor = Session | Connection
Writer = Session | Connection | DriverConnection


def _connection(target: Executor) -> Connection:
    return target.connection() if isinstance(target, Session) else target


def _driver(target: Writer) -> DriverConnection:
    return target if isinstance(target, DriverConnection) else driver_of(_connection(target))


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
    _INSERT_EVENT.execute(
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


def _claim_oldest_statement(of_kinds: bool) -> DriverStatement:
    """Claim the oldest waiting task in one statement, returning its id and new state.

    Waiting: ready (it becomes claimed), or repairing with no slot (a repair episode
    waits for one; it stays repairing, now with the claim). A milestone only while its plan
    runs its milestones (not while it awaits approval again, nor once it ended). OF_KINDS:
    only a task of the kinds bound as kind_0..kind_3 whose parent has no other milestone
    in flight (states bound as in_flight_0..): a plan advances one milestone at a time.
    One statement, so selecting and updating cannot race: on SQLite under the write lock
    (BEGIN IMMEDIATE), on PostgreSQL by skipping rows other claimers hold.
    """
    candidate = tasks.alias("candidate")
    plan = tasks.alias("plan")
    running_plans = select(plan.c.id).where(plan.c.state == "milestones")
    conditions: list[ColumnElement[bool]] = [
        # IN on the state keeps the (state, id) index usable; the OR alone would scan.
        candidate.c.state.in_([sql_literal("'ready'"), sql_literal("'repairing'")]),
        (candidate.c.state == "ready") | candidate.c.claim_slot.is_(None),
        candidate.c.parent_id.is_(None) | candidate.c.parent_id.in_(running_plans),
    ]
    if of_kinds:
        sibling = tasks.alias("sibling")
        busy_parent = select(sibling.c.parent_id).where(
            sibling.c.parent_id.is_not(None),
            sibling.c.id != candidate.c.id,
            sibling.c.state.in_([bindparam(f"in_flight_{n}") for n in range(len(IN_FLIGHT))]),
        )
        conditions += [
            candidate.c.kind.in_([bindparam(f"kind_{n}") for n in range(len(TASK_KINDS))]),
            candidate.c.parent_id.is_(None) | candidate.c.parent_id.not_in(busy_parent),
        ]
    # On PostgreSQL a row another claimer has just taken is locked until it commits:
    # skip it (SQLite renders no FOR UPDATE; its write lock already serialises claims).
    oldest = (
        select(candidate.c.id)
        .where(*conditions)
        .order_by(candidate.c.id)
        .limit(1)
        .with_for_update(skip_locked=True, of=candidate)
    )
    statement = (
        update(tasks)
        .where(tasks.c.id == oldest.scalar_subquery(), tasks.c.claim_slot.is_(None))
        .values(
            state=case((tasks.c.state == "repairing", "repairing"), else_="claimed"),
            version=tasks.c.version + 1,
            updated_at=bindparam("now"),
            claim_slot=bindparam("slot"),
            claim_token=bindparam("holder"),
            claimed_at=bindparam("now"),
        )
        .returning(tasks.c.id, tasks.c.state)
    )
    return DriverStatement(statement)


_CLAIM_ANY = _claim_oldest_statement(of_kinds=False)
_CLAIM_OF_KINDS = _claim_oldest_statement(of_kinds=True)


def claim_next(
    db: Database, slot: int, holder_token: str, kinds: Sequence[str] | None = None
) -> int | None:
    """Claim the oldest waiting task (of KINDS, when given) for SLOT in a write transaction
    of its own; return its id, or None when nothing is eligible.

    The statements are compiled before BEGIN IMMEDIATE: the first claim of a process
    would otherwise hold every other writer back for the milliseconds that takes.
    """
    params: dict[str, Any] = {"slot": slot, "holder": holder_token}
    statement = _CLAIM_ANY
    if kinds is not None:
        unknown = set(kinds) - set(TASK_KINDS)
        if unknown:
            raise ValueError(f"unknown task kinds {sorted(unknown)}")
        if not kinds:
            return None
        padded = [*kinds, *[kinds[-1]] * (len(TASK_KINDS) - len(kinds))]
        params.update({f"kind_{n}": kind for n, kind in enumerate(padded)})
        params.update({f"in_flight_{n}": state for n, state in enumerate(IN_FLIGHT)})
        statement = _CLAIM_OF_KINDS
    dialect = db.engine.dialect
    statement.prepare(dialect)
    _INSERT_EVENT.prepare(dialect)
    with db.driver_transaction() as connection:
        params["now"] = utcnow()
        rows = statement.execute(connection, params).fetchall()  # drained before COMMIT
        if not rows:
            return None
        task_id, state = int(rows[0][0]), str(rows[0][1])
        append_event(
            connection,
            "task.claimed",
            task_id=task_id,
            from_state="ready" if state == "claimed" else state,
            to_state=state,
            actor=f"slot-{slot}",
            data={"slot": slot, "holder": holder_token},
        )
    return task_id


def active_claims(session: Executor) -> list[Any]:
    """(id, version, state, slot, token, claimed_at) of every task that holds a slot."""
    return list(
        _connection(session).execute(
            select(
                tasks.c.id,
                tasks.c.version,
                tasks.c.state,
                tasks.c.claim_slot.label("slot"),
                tasks.c.claim_token.label("token"),
                tasks.c.claimed_at,
            ).where(tasks.c.claim_slot.is_not(None))
        )
    )


def task_state(session: Writer, task_id: int) -> tuple[str, int] | None:
    """(state, version) of TASK_ID as this transaction sees it."""
    row = _STATE_OF.execute(_driver(session), {"task_id": task_id}).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def tasks_in_states(session: Executor, states: Sequence[str]) -> list[tuple[int, str, str]]:
    """(id, state, kind) of every task in STATES, by id."""
    rows = _connection(session).execute(
        select(tasks.c.id, tasks.c.state, tasks.c.kind)
        .where(tasks.c.state.in_(list(states)))
        .order_by(tasks.c.id)
    )
    return [(int(task_id), str(state), str(kind)) for task_id, state, kind in rows]


def states_of(session: Executor, task_ids: Sequence[int]) -> dict[int, tuple[str, datetime]]:
    """State and last change of each of TASK_IDS that exists."""
    rows = _connection(session).execute(
        select(tasks.c.id, tasks.c.state, tasks.c.updated_at).where(tasks.c.id.in_(task_ids))
    )
    return {int(i): (str(s), u) for i, s, u in rows}


def prune_events(session: Executor, kind: str, keep: int) -> int:
    """Delete all but the latest KEEP events of KIND (scheduler checks, never task history)."""
    connection = _connection(session)
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
    found = _connection(session).scalar(
        select(attempts.c.id).where(attempts.c.finished_at.is_(None)).limit(1)
    )
    return found is not None


def kind_and_state(session: Executor, task_id: int) -> tuple[str, str] | None:
    row = (
        _connection(session)
        .execute(select(tasks.c.kind, tasks.c.state).where(tasks.c.id == task_id))
        .first()
    )
    return None if row is None else (str(row[0]), str(row[1]))


def claimed_on(session: Executor, slot: int) -> tuple[int, str, str] | None:
    """(id, kind, state) of the task claimed on SLOT and not yet started: claimed, or a
    repair episode whose claim names no job's process yet."""
    row = (
        _connection(session)
        .execute(
            select(tasks.c.id, tasks.c.kind, tasks.c.state).where(
                tasks.c.claim_slot == slot,
                (tasks.c.state == "claimed")
                | ((tasks.c.state == "repairing") & tasks.c.claim_token.not_like("%-pid%")),
            )
        )
        .first()
    )
    return None if row is None else (int(row[0]), str(row[1]), str(row[2]))


def count_by_state(session: Executor) -> dict[str, int]:
    rows = _connection(session).execute(select(tasks.c.state, func.count()).group_by(tasks.c.state))
    return {str(state): int(count) for state, count in rows}
