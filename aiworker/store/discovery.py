"""Recording discovered work: repositories and tasks, idempotently, with events."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from aiworker.store.models import Task
from aiworker.store.task_records import create_task
from aiworker.store.tasks import transition

ACTIVE_STATES = ("new", "ready", "claimed", "running", "awaiting_ci", "awaiting_review")


def tasks_of(session: Session, repository_id: int) -> dict[tuple[str, int], Task]:
    rows = session.scalars(
        select(Task).where(Task.repository_id == repository_id, Task.issue_number.is_not(None))
    ).all()
    return {(t.kind, t.issue_number): t for t in rows if t.issue_number is not None}


def record_discovered(
    session: Session,
    repository_id: int,
    kind: str,
    number: int,
    title: str,
    fingerprint: str,
    known: Task | None,
    actor: str | None,
) -> str:
    """Create, resume or update the task for an authorised issue; say which (or 'unchanged')."""
    if known is None:
        task = create_task(
            session,
            repository_id,
            kind,
            issue_number=number,
            title=title,
            state="ready",
            actor=actor,
        )
        transition(
            session,
            task.id,
            task.version,
            "ready",
            "ready",
            kind="task.scope_recorded",
            data={"fingerprint": fingerprint},
            scope_fingerprint=fingerprint,
        )
        return "created"
    outcome = "unchanged"
    state, version = known.state, known.version
    if state == "paused":
        if not transition(
            session,
            known.id,
            version,
            "paused",
            "ready",
            actor=actor,
            kind="task.resumed",
            data={"reason": "authorised again"},
        ):
            return "conflict"
        state, version, outcome = "ready", version + 1, "resumed"
    if known.scope_fingerprint != fingerprint or known.title != title:
        if not transition(
            session,
            known.id,
            version,
            state,
            state,
            actor=actor,
            kind="task.scope_changed",
            data={"from": known.scope_fingerprint, "to": fingerprint},
            scope_fingerprint=fingerprint,
            title=title,
        ):
            return "conflict"
        outcome = "updated" if outcome == "unchanged" else outcome
    return outcome


def pause_task(session: Session, task: Task, reason: str) -> bool:
    if task.state not in ACTIVE_STATES:
        return False
    return transition(
        session,
        task.id,
        task.version,
        task.state,
        "paused",
        kind="task.paused",
        data={"reason": reason},
        claim_slot=None,
        claim_token=None,
    )
