"""Claims: a slot takes the oldest waiting task in one statement.

On SQLite the claim and its event run under the write lock (BEGIN IMMEDIATE); on
PostgreSQL the claim skips rows other claimers hold (FOR UPDATE SKIP LOCKED) and, with
its event, is one statement that commits on its own. Each claim records the controller
whose slot holds it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Insert, Update, bindparam, case, insert, literal, select, update
from sqlalchemy import literal_column as sql_literal
from sqlalchemy.sql.elements import ColumnElement

from aiworker.store.driver import DriverStatement
from aiworker.store.engine import Database
from aiworker.store.tables import events, tasks, utcnow
from aiworker.store.tasks import (
    EVENT_COLUMNS,
    IN_FLIGHT,
    INSERT_EVENT,
    TASK_KINDS,
    Executor,
    append_event,
    connection_of,
)


def _claim_oldest(of_kinds: bool) -> Update:
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
        # As ix_tasks_waiting's condition reads, so that both engines scan that index.
        candidate.c.claim_slot.is_(None),
        candidate.c.state.in_([sql_literal("'ready'"), sql_literal("'repairing'")]),
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
    return (
        update(tasks)
        .where(tasks.c.id == oldest.scalar_subquery(), tasks.c.claim_slot.is_(None))
        .values(
            state=case((tasks.c.state == "repairing", "repairing"), else_="claimed"),
            version=tasks.c.version + 1,
            updated_at=bindparam("now"),
            claim_slot=bindparam("slot"),
            claim_token=bindparam("holder"),
            claim_host=bindparam("host", type_=tasks.c.claim_host.type),
            claimed_at=bindparam("now"),
        )
        .returning(tasks.c.id, tasks.c.state)
    )


def _with_event(claim: Update) -> Insert:
    """CLAIM and its task.claimed event as one statement (a data-modifying CTE, which
    PostgreSQL has and SQLite lacks), returning the task's id and new state: alone in
    its transaction it commits on its own, one round trip where BEGIN, the claim, the
    event and COMMIT took four."""
    claimed = claim.cte("claimed")
    from_state = case((claimed.c.state == "claimed", "ready"), else_=claimed.c.state)
    row = select(
        claimed.c.id,
        literal("task.claimed"),
        from_state,
        claimed.c.state,
        bindparam("actor", type_=events.c.actor.type),
        bindparam("data", type_=events.c.data.type),
        bindparam("now", type_=events.c.created_at.type),
    )
    return (
        insert(events)
        .from_select(list(EVENT_COLUMNS), row)
        .returning(events.c.task_id, events.c.to_state)
    )


@functools.cache
def _claim(of_kinds: bool, with_event: bool) -> DriverStatement:
    """Built on first use: a process builds only the one its engine and caller need (an
    idle tick's start-up pays for one, not four)."""
    claim = _claim_oldest(of_kinds)
    return DriverStatement(_with_event(claim) if with_event else claim)


def claim_next(
    db: Database, slot: int, holder_token: str, kinds: Sequence[str] | None = None
) -> int | None:
    """Claim the oldest waiting task (of KINDS, when given) for SLOT in a write transaction
    of its own; return its id, or None when nothing is eligible.

    The statements are compiled before BEGIN IMMEDIATE: the first claim of a process
    would otherwise hold every other writer back for the milliseconds that takes.
    """
    params: dict[str, Any] = {"slot": slot, "holder": holder_token, "host": db.host}
    if kinds is not None:
        unknown = set(kinds) - set(TASK_KINDS)
        if unknown:
            raise ValueError(f"unknown task kinds {sorted(unknown)}")
        if not kinds:
            return None
        padded = [*kinds, *[kinds[-1]] * (len(TASK_KINDS) - len(kinds))]
        params.update({f"kind_{n}": kind for n, kind in enumerate(padded)})
        params.update({f"in_flight_{n}": state for n, state in enumerate(IN_FLIGHT)})
    statement = _claim(of_kinds=kinds is not None, with_event=not db.sqlite)
    dialect = db.engine.dialect
    if not db.sqlite:
        statement.prepare(dialect)
        params.update(actor=f"slot-{slot}", data={"slot": slot, "holder": holder_token})
        with db.driver_transaction(one_statement=True) as connection:
            params["now"] = utcnow()
            rows = statement.execute(connection, params).fetchall()
        return int(rows[0][0]) if rows else None
    statement.prepare(dialect)
    INSERT_EVENT.prepare(dialect)
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
    """(id, version, state, kind, slot, token, host, claimed_at) of every task that holds a slot
    (host: the controller whose slot it is; None for a claim made before hosts were
    recorded, which counts as every controller's own)."""
    return list(
        connection_of(session).execute(
            select(
                tasks.c.id,
                tasks.c.version,
                tasks.c.state,
                tasks.c.kind,
                tasks.c.claim_slot.label("slot"),
                tasks.c.claim_token.label("token"),
                tasks.c.claim_host.label("host"),
                tasks.c.claimed_at,
            ).where(tasks.c.claim_slot.is_not(None))
        )
    )


def claimed_on(session: Executor, slot: int, host: str | None) -> tuple[int, str, str] | None:
    """(id, kind, state) of the task claimed on HOST's SLOT and not yet started: claimed,
    or a repair episode whose claim names no job's process yet."""
    row = (
        connection_of(session)
        .execute(
            select(tasks.c.id, tasks.c.kind, tasks.c.state).where(
                tasks.c.claim_slot == slot,
                tasks.c.claim_host.is_(None) | (tasks.c.claim_host == host),
                (tasks.c.state == "claimed")
                | ((tasks.c.state == "repairing") & tasks.c.claim_token.not_like("%-pid%")),
            )
        )
        .first()
    )
    return None if row is None else (int(row[0]), str(row[1]), str(row[2]))
