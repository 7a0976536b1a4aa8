"""Attempts: one model or execution phase run, with the settings it used."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from aiworker.store.models import Attempt, utcnow


def start_attempt(
    session: Session,
    task_id: int,
    phase: str,
    provider: str | None,
    model: str | None,
    effort: str | None,
    settings: dict[str, Any],
) -> int:
    """Record the settings used now, so later edits never rewrite history."""
    attempt = Attempt(
        task_id=task_id,
        phase=phase,
        provider=provider,
        model=model,
        effort=effort,
        settings=settings,
    )
    session.add(attempt)
    session.flush()
    return attempt.id


def finish_attempt(
    session: Session,
    attempt_id: int,
    outcome: str,
    *,
    refunded: bool = False,
    result_path: str | None = None,
    log_path: str | None = None,
) -> None:
    session.execute(
        update(Attempt)
        .where(Attempt.id == attempt_id)
        .values(
            finished_at=utcnow(),
            outcome=outcome,
            refunded=refunded,
            result_path=result_path,
            log_path=log_path,
        )
    )


def providers_tried_at(session: Session, task_id: int, base: str) -> set[str]:
    """Providers that already ran an attempt of TASK_ID on the snapshot BASE."""
    rows = session.scalars(select(Attempt).where(Attempt.task_id == task_id)).all()
    return {a.provider for a in rows if a.provider and a.settings.get("base") == base}
