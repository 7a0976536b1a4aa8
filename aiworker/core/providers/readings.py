"""What the web plane shows of providers: the stored quota readings with their age, never
a fresh read (a page refresh makes no upstream call). A reading older than STALE_AFTER is
marked stale; the web plane only shows it, and admission always reads afresh before it
grants a start."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.report import Report
from aiworker.store.observations import latest_observations

STALE_AFTER = timedelta(minutes=15)


@dataclass
class ReadingsReport(Report):
    providers: list[str]
    readings: list[dict[str, Any]] = field(default_factory=list)
    stale_after_s: int = int(STALE_AFTER.total_seconds())


def stored_readings(env: Environment, now: datetime | None = None) -> ReadingsReport:
    now = now or datetime.now(UTC)
    names = [str(name) for name in env.loaded.config.providers]
    db = env.open_database()
    try:
        with db.read() as session:
            rows = latest_observations(session, names)
            readings = [
                {
                    "provider": r.provider,
                    "window": r.window,
                    "used_percent": r.used_percent,
                    "resets_at": r.resets_at.isoformat() if r.resets_at else None,
                    "observed_at": r.observed_at.isoformat(),
                    "age_s": int((now - r.observed_at).total_seconds()),
                    "stale": now - r.observed_at > STALE_AFTER,
                    "valid": r.valid,
                    "source": r.source,
                    "reason": r.reason,
                }
                for r in rows
            ]
    finally:
        db.dispose()
    return ReadingsReport(names, readings)
