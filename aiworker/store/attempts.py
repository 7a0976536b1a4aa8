"""Attempts: one model or execution phase run, with the settings it used and how it ended."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from aiworker.store.budgets import charge, refund
from aiworker.store.models import Attempt, utcnow


def start_attempt(
    session: Session,
    task_id: int,
    phase: str,
    provider: str | None,
    model: str | None,
    effort: str | None,
    settings: dict[str, Any],
    *,
    pid: int | None = None,
    host: str | None = None,
) -> int:
    """Record the settings used now, so later edits never rewrite history; the attempt
    is charged to the task's budget for PHASE in the same transaction."""
    attempt = Attempt(
        task_id=task_id,
        phase=phase,
        provider=provider,
        model=model,
        effort=effort,
        settings=settings,
        pid=pid,
        host=host,
    )
    session.add(attempt)
    session.flush()
    charge(session, task_id, phase)
    return attempt.id


def set_workspace(session: Session, attempt_id: int, path: str) -> None:
    session.execute(update(Attempt).where(Attempt.id == attempt_id).values(workspace_path=path))


def finish_attempt(
    session: Session,
    attempt_id: int,
    outcome: str,
    *,
    reason: str = "",
    refunded: bool = False,
) -> bool:
    """Close an open attempt; False when it was already closed (by its phase or recovery).
    A refund gives its budget charge back in the same transaction."""
    closed = session.execute(
        update(Attempt)
        .where(Attempt.id == attempt_id, Attempt.finished_at.is_(None))
        .values(
            finished_at=utcnow(),
            outcome=outcome,
            reason=reason[:2000],
            refunded=refunded,
        )
    )
    if closed.rowcount != 1:  # type: ignore[attr-defined]
        return False
    if refunded:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        refund(session, attempt.task_id, attempt.phase)
    return True


def open_attempts(session: Session, task_id: int | None = None) -> Sequence[Attempt]:
    query = select(Attempt).where(Attempt.finished_at.is_(None))
    if task_id is not None:
        query = query.where(Attempt.task_id == task_id)
    return session.scalars(query.order_by(Attempt.id)).all()


def attempted_since(session: Session, task_id: int, since: datetime) -> bool:
    """Whether an attempt of TASK_ID started at or after SINCE."""
    query = select(Attempt.id).where(Attempt.task_id == task_id, Attempt.started_at >= since)
    return session.execute(query.limit(1)).first() is not None


def attempts_of(session: Session, task_id: int) -> Sequence[Attempt]:
    return session.scalars(
        select(Attempt).where(Attempt.task_id == task_id).order_by(Attempt.id)
    ).all()


def providers_tried_at(session: Session, task_id: int, base: str) -> set[str]:
    """Providers that already ran an attempt of TASK_ID on the snapshot BASE."""
    rows = attempts_of(session, task_id)
    return {a.provider for a in rows if a.provider and a.settings.get("base") == base}


def set_attempt_files(
    session: Session,
    attempt_id: int,
    prompt_path: str | None,
    result_path: str | None,
    log_path: str | None,
) -> None:
    """Where the attempt's prompt, result document and provider output are kept."""
    session.execute(
        update(Attempt)
        .where(Attempt.id == attempt_id)
        .values(prompt_path=prompt_path, result_path=result_path, log_path=log_path)
    )


def record_attempt_use(session: Session, attempt_id: int, use: dict[str, Any]) -> None:
    """What a local model's try used (requests, tokens, seconds, the bound that ended it),
    kept with the attempt's settings as `route_use`."""
    attempt = session.get(Attempt, attempt_id)
    if attempt is not None:
        attempt.settings = {**attempt.settings, "route_use": use}


def work_hosts(session: Session, task_ids: Sequence[int]) -> dict[int, str]:
    """For each of TASK_IDS, the controller whose implementation or repair attempt ran
    last: that host's git cache and artifact store hold the task's unpublished commits."""
    latest = (
        select(Attempt.task_id, func.max(Attempt.id).label("id"))
        .where(
            Attempt.task_id.in_(list(task_ids)),
            Attempt.phase.in_(["implementation", "repair"]),
            Attempt.host.is_not(None),
        )
        .group_by(Attempt.task_id)
        .subquery()
    )
    rows = session.execute(
        select(Attempt.task_id, Attempt.host).join(latest, Attempt.id == latest.c.id)
    )
    return {int(task): str(host) for task, host in rows}
