"""Attempts: one model or execution phase run, with the settings it used."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
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
