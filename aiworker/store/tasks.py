"""Task queries. Every state change is a compare-and-update on `version` plus an event."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from aiworker.store.models import Event, Repository, Task, utcnow

TASK_KINDS = ("plan", "milestone", "feature", "issue")
TASK_STATES = (
    "new",
    "ready",
    "claimed",
    "running",
    "awaiting_ci",
    "awaiting_review",
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


def ensure_repository(session: Session, index: int, owner: str, name: str) -> Repository:
    repo = session.scalar(select(Repository).where(Repository.index == index))
    if repo is None:
        repo = Repository(index=index, owner=owner, name=name, settings={})
        session.add(repo)
        session.flush()
    return repo


def append_event(
    session: Session,
    kind: str,
    *,
    task_id: int | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    actor: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> None:
    session.add(
        Event(
            task_id=task_id,
            kind=kind,
            from_state=from_state,
            to_state=to_state,
            actor=actor,
            data=dict(data or {}),
        )
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
    )
    session.add(task)
    session.flush()
    append_event(session, "task.created", task_id=task.id, to_state=state, actor=actor)
    return task


def transition(
    session: Session,
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
    result = session.execute(
        update(Task)
        .where(
            Task.id == task_id,
            Task.version == expected_version,
            Task.state == from_state,
        )
        .values(state=to_state, version=Task.version + 1, updated_at=utcnow(), **changes)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
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
    session: Session,
    task: Task,
    slot: int,
    holder_token: str,
    *,
    now: datetime | None = None,
) -> bool:
    """Claim a ready task for SLOT; False when someone else changed it first."""
    return transition(
        session,
        task.id,
        task.version,
        "ready",
        "claimed",
        actor=f"slot-{slot}",
        kind="task.claimed",
        data={"slot": slot, "holder": holder_token},
        claim_slot=slot,
        claim_token=holder_token,
        claimed_at=now or utcnow(),
    )


def ready_tasks(session: Session, limit: int = 50) -> Sequence[Task]:
    return session.scalars(
        select(Task).where(Task.state == "ready").order_by(Task.id).limit(limit)
    ).all()


def get_task(session: Session, task_id: int) -> Task | None:
    return session.get(Task, task_id)


def count_by_state(session: Session) -> dict[str, int]:
    rows = session.execute(select(Task.state, func.count()).group_by(Task.state)).all()
    return {state: count for state, count in rows}


def claims_by_slot(session: Session) -> dict[int, Task]:
    rows = session.scalars(select(Task).where(Task.claim_slot.is_not(None))).all()
    return {t.claim_slot: t for t in rows if t.claim_slot is not None}


def latest_event(session: Session, kind: str) -> Event | None:
    return session.scalar(
        select(Event).where(Event.kind == kind).order_by(Event.id.desc()).limit(1)
    )
