"""Task queries. Every state change is a compare-and-update on `version` plus an event."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Update, bindparam, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from aiworker.store.models import Event, Repository, Task, utcnow

TASK_KINDS = ("plan", "milestone", "feature", "issue")
TASK_STATES = (
    "new",
    "ready",
    "claimed",
    "running",
    "implemented",
    "awaiting_ci",
    "awaiting_review",
    "approved",
    "paused",
    "done",
    "failed",
    "cancelled",
)
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
    }
)


# Hot paths take either an ORM session or a bare connection from Database.transaction().
Executor = Session | Connection


def _connection(target: Executor) -> Connection:
    return target.connection() if isinstance(target, Session) else target


def ensure_repository(session: Session, index: int, owner: str, name: str) -> Repository:
    """The repository with this stable index; a rename updates owner/name in place."""
    repo = session.scalar(select(Repository).where(Repository.index == index))
    if repo is None:
        repo = Repository(index=index, owner=owner, name=name, settings={})
        session.add(repo)
        session.flush()
        append_event(session, "repository.added", data={"index": index, "name": f"{owner}/{name}"})
    elif (repo.owner, repo.name) != (owner, name):
        append_event(
            session,
            "repository.renamed",
            data={"index": index, "from": f"{repo.owner}/{repo.name}", "to": f"{owner}/{name}"},
        )
        repo.owner, repo.name = owner, name
    return repo


_INSERT_EVENT = insert(Event)


def append_event(
    session: Executor,
    kind: str,
    *,
    task_id: int | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    actor: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> None:
    # Straight to the connection: events are never read back in the same
    # transaction, and the ORM's unit of work costs more than the statement.
    _connection(session).execute(
        _INSERT_EVENT,
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


def create_task(
    session: Session,
    repository_id: int,
    kind: str,
    *,
    issue_number: int | None = None,
    title: str = "",
    state: str = "ready",
    parent_id: int | None = None,
    actor: str | None = None,
    scope_fingerprint: str | None = None,
) -> Task:
    if kind not in TASK_KINDS:
        raise ValueError(f"unknown task kind {kind!r}")
    if state not in TASK_STATES:
        raise ValueError(f"unknown task state {state!r}")
    task = Task(
        repository_id=repository_id,
        kind=kind,
        issue_number=issue_number,
        title=title,
        state=state,
        parent_id=parent_id,
        scope_fingerprint=scope_fingerprint,
    )
    session.add(task)
    session.flush()
    append_event(session, "task.created", task_id=task.id, to_state=state, actor=actor)
    return task


@functools.cache
def _transition_statement(columns: tuple[str, ...]) -> Update:
    """One prebuilt compare-and-update per set of changed columns (built once, reused)."""
    values: dict[str, Any] = {name: bindparam(f"new_{name}") for name in columns}
    return (
        update(Task)
        .where(
            Task.id == bindparam("task_id"),
            Task.version == bindparam("expected_version"),
            Task.state == bindparam("from_state"),
        )
        .values(
            state=bindparam("to_state"),
            version=Task.version + 1,
            updated_at=bindparam("now"),
            **values,
        )
    )


def transition(
    session: Executor,
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
    caller must re-read and decide again.
    """
    if to_state not in TASK_STATES:
        raise ValueError(f"unknown task state {to_state!r}")
    unknown = set(changes) - _MUTABLE
    if unknown:
        raise ValueError(f"transition cannot set {sorted(unknown)}")
    columns = tuple(sorted(changes))
    params = {f"new_{name}": changes[name] for name in columns}
    result = _connection(session).execute(
        _transition_statement(columns),
        {
            "task_id": task_id,
            "expected_version": expected_version,
            "from_state": from_state,
            "to_state": to_state,
            "now": utcnow(),
            **params,
        },
    )
    if result.rowcount != 1:
        return False
    append_event(
        session,
        kind,
        task_id=task_id,
        from_state=from_state,
        to_state=to_state,
        actor=actor,
        data=data,
    )
    return True


def claim(
    session: Executor,
    task_id: int,
    expected_version: int,
    slot: int,
    holder_token: str,
    *,
    now: datetime | None = None,
) -> bool:
    """Claim a ready task for SLOT; False when someone else changed it first."""
    return transition(
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


_OLDEST_READY = (
    select(Task.id, Task.version).where(Task.state == "ready").order_by(Task.id).limit(1)
)


def claim_next_ready(session: Executor, slot: int, holder_token: str) -> int | None:
    """Inside a write transaction: claim the oldest ready task; return its id or None."""
    while True:
        row = _connection(session).execute(_OLDEST_READY).first()
        if row is None:
            return None
        if claim(session, row.id, row.version, slot, holder_token):
            return int(row.id)


def active_claims(session: Executor) -> list[Any]:
    """(id, version, state, slot, token, claimed_at) of every task that holds a slot."""
    return list(
        _connection(session).execute(
            select(
                Task.id,
                Task.version,
                Task.state,
                Task.claim_slot.label("slot"),
                Task.claim_token.label("token"),
                Task.claimed_at,
            ).where(Task.claim_slot.is_not(None))
        )
    )


def release_claim(session: Executor, task_id: int, version: int, state: str, reason: str) -> bool:
    """Give a claimed task back (its holder died): ready again, with an event saying why."""
    return transition(
        session,
        task_id,
        version,
        state,
        "ready",
        kind="task.claim_recovered",
        data={"reason": reason},
        claim_slot=None,
        claim_token=None,
        claimed_at=None,
    )


def claim_next_where(
    session: Executor, slot: int, holder_token: str, kinds: Sequence[str]
) -> int | None:
    """Inside a write transaction: claim the oldest ready task of KINDS whose parent has no
    other milestone in flight (a plan advances one milestone at a time)."""
    if not kinds:
        return None
    busy_parent = select(Task.parent_id).where(
        Task.parent_id.is_not(None),
        Task.state.in_(("claimed", "running", "awaiting_ci", "awaiting_review")),
    )
    while True:
        row = (
            _connection(session)
            .execute(
                select(Task.id, Task.version)
                .where(
                    Task.state == "ready",
                    Task.kind.in_(list(kinds)),
                    (Task.parent_id.is_(None)) | (Task.parent_id.not_in(busy_parent)),
                )
                .order_by(Task.id)
                .limit(1)
            )
            .first()
        )
        if row is None:
            return None
        if claim(session, row.id, row.version, slot, holder_token):
            return int(row.id)


def ready_tasks(session: Session, limit: int = 50) -> Sequence[Task]:
    return session.scalars(
        select(Task).where(Task.state == "ready").order_by(Task.id).limit(limit)
    ).all()


def tasks_in_states(session: Session, states: Sequence[str]) -> list[tuple[int, str]]:
    rows = session.execute(
        select(Task.id, Task.state).where(Task.state.in_(list(states))).order_by(Task.id)
    ).all()
    return [(int(task_id), str(state)) for task_id, state in rows]


def claimed_on(session: Session, slot: int) -> Task | None:
    return session.scalar(select(Task).where(Task.claim_slot == slot, Task.state == "claimed"))


def get_task(session: Session, task_id: int) -> Task | None:
    return session.get(Task, task_id)


def count_by_state(session: Session) -> dict[str, int]:
    rows = session.execute(select(Task.state, func.count()).group_by(Task.state)).all()
    return {str(state): int(count) for state, count in rows}


def claims_by_slot(session: Session) -> dict[int, Task]:
    rows = session.scalars(select(Task).where(Task.claim_slot.is_not(None))).all()
    return {t.claim_slot: t for t in rows if t.claim_slot is not None}


def latest_event(session: Session, kind: str) -> Event | None:
    return session.scalar(
        select(Event).where(Event.kind == kind).order_by(Event.id.desc()).limit(1)
    )
