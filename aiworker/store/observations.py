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


RUN_WINDOW = "run"


def record_run(session: Session, provider: str, outcome: str, reason: str) -> None:
    """A provider run's outcome: 'ok' resets backoff; anything else counts as a failure."""
    record_observation(
        session,
        provider=provider,
        window=RUN_WINDOW,
        used_percent=None,
        resets_at=None,
        valid=outcome == "ok",
        source="run",
        reason=f"{outcome}: {reason}" if reason else outcome,
    )


def consecutive_failures(
    session: Session, provider: str, limit: int = 20
) -> tuple[int, datetime | None]:
    """How many runs failed in a row most recently, and when the last one failed."""
    rows = session.execute(
        select(ProviderObservation.valid, ProviderObservation.observed_at)
        .where(ProviderObservation.provider == provider, ProviderObservation.window == RUN_WINDOW)
        .order_by(ProviderObservation.id.desc())
        .limit(limit)
    ).all()
    count = 0
    last = None
    for valid, observed_at in rows:
        if valid:
            break
        count += 1
        last = last or observed_at
    return count, last


def latest_observations(session: Session, providers: list[str]) -> list[ProviderObservation]:
    """The newest observation of each (provider, window) of PROVIDERS, by provider and window."""
    newest = (
        select(func.max(ProviderObservation.id))
        .where(ProviderObservation.provider.in_(providers))
        .group_by(ProviderObservation.provider, ProviderObservation.window)
    )
    return list(
        session.scalars(
            select(ProviderObservation)
            .where(ProviderObservation.id.in_(newest))
            .order_by(ProviderObservation.provider, ProviderObservation.window)
        )
    )
