"""Provider observations: every quota reading and admission decision, and running jobs."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from aiworker.store.models import Attempt, ProviderObservation, utcnow


def record_observation(
    session: Session,
    *,
    provider: str,
    window: str,
    used_percent: float | None,
    resets_at: datetime | None,
    valid: bool,
    source: str,
    reason: str,
) -> None:
    session.execute(
        insert(ProviderObservation).values(
            provider=provider,
            window=window,
            used_percent=used_percent,
            resets_at=resets_at,
            observed_at=utcnow(),
            valid=valid,
            source=source,
            reason=reason,
        )
    )


def running_jobs(session: Session) -> dict[str, int]:
    """Unfinished attempts per provider (each costs headroom in admission)."""
    rows = session.execute(
        select(Attempt.provider, func.count())
        .where(Attempt.finished_at.is_(None), Attempt.provider.is_not(None))
        .group_by(Attempt.provider)
    ).all()
    return {str(provider): int(count) for provider, count in rows}
