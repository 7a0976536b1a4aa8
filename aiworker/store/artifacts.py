"""The artifact store's records: who refers to which payload, until when, and when the
payload was removed. The payloads themselves are files (runtime/artifact_files.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, exists, func, insert, or_, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from aiworker.store.tables import artifacts, tasks

ENDED = ("done", "failed", "cancelled")
PAYLOAD_LOCK = 0x61727466  # "artf": the advisory lock of serialize_payload_changes


@dataclass(frozen=True)
class ArtifactRecord:
    id: int
    sha256: str
    size: int
    media_type: str
    name: str
    task_id: int | None
    attempt_id: int | None
    receipt_id: int | None
    worker_job: str | None
    created_at: datetime
    expires_at: datetime
    removed_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "sha256": self.sha256,
            "size": self.size,
            "media_type": self.media_type,
            "task": self.task_id,
            "attempt": self.attempt_id,
            "receipt": self.receipt_id,
            "worker_job": self.worker_job,
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "removed_at": self.removed_at.isoformat() if self.removed_at else None,
        }


def _record(row: Any) -> ArtifactRecord:
    return ArtifactRecord(**{c.name: row._mapping[c.name] for c in artifacts.columns})


def add_artifact(session: Session | Connection, **values: Any) -> int:
    """One reference (SHA256, SIZE, MEDIA_TYPE, NAME, CREATED_AT, EXPIRES_AT and what
    refers: task_id, attempt_id, receipt_id, worker_job); call only once the payload is
    in place."""
    key = session.execute(insert(artifacts).values(**values).returning(artifacts.c.id))
    return int(key.scalar_one())


def artifacts_of_receipt(session: Session, receipt_id: int) -> list[ArtifactRecord]:
    rows = session.execute(
        select(artifacts).where(artifacts.c.receipt_id == receipt_id).order_by(artifacts.c.id)
    )
    return [_record(row) for row in rows]


def artifacts_of_task(session: Session, task_id: int) -> list[ArtifactRecord]:
    rows = session.execute(
        select(artifacts).where(artifacts.c.task_id == task_id).order_by(artifacts.c.id)
    )
    return [_record(row) for row in rows]


def references_to(session: Session, sha256: str) -> list[ArtifactRecord]:
    rows = session.execute(
        select(artifacts).where(artifacts.c.sha256 == sha256).order_by(artifacts.c.id)
    )
    return [_record(row) for row in rows]


def removable(
    session: Session, now: datetime, ended_before: datetime, limit: int
) -> list[tuple[str, int]]:
    """Up to LIMIT payloads (digest, size) no reference keeps any longer: every row naming
    the digest has expired, and each one's task (if any) ended before ENDED_BEFORE."""
    keeper = artifacts.alias("keeper")
    keeper_task = tasks.alias("keeper_task")
    kept = exists(
        select(keeper.c.id)
        .select_from(keeper.outerjoin(keeper_task, keeper_task.c.id == keeper.c.task_id))
        .where(
            keeper.c.sha256 == artifacts.c.sha256,
            or_(
                keeper.c.expires_at > now,
                and_(
                    keeper.c.task_id.is_not(None),
                    or_(keeper_task.c.state.not_in(ENDED), keeper_task.c.updated_at > ended_before),
                ),
            ),
        )
    )
    rows = session.execute(
        select(artifacts.c.sha256, func.max(artifacts.c.size))
        .where(artifacts.c.removed_at.is_(None), artifacts.c.expires_at <= now, ~kept)
        .group_by(artifacts.c.sha256)
        .order_by(func.min(artifacts.c.id))
        .limit(limit)
    )
    return [(str(sha), int(size)) for sha, size in rows]


def mark_removed(session: Session, digests: Iterable[str], now: datetime) -> int:
    names = list(digests)
    if not names:
        return 0
    result = session.execute(
        update(artifacts)
        .where(artifacts.c.sha256.in_(names), artifacts.c.removed_at.is_(None))
        .values(removed_at=now)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def live_digests(session: Session) -> set[str]:
    """Every digest some record still names as present (for restore's check)."""
    rows = session.execute(
        select(artifacts.c.sha256).where(artifacts.c.removed_at.is_(None)).distinct()
    )
    return {str(sha) for (sha,) in rows}


def serialize_payload_changes(session: Session | Connection) -> None:
    """Take the lock that orders storing against the retention pass. SQLite's write
    transactions (BEGIN IMMEDIATE) already run one at a time; PostgreSQL's take this
    advisory lock until they end."""
    dialect = session.dialect if isinstance(session, Connection) else session.get_bind().dialect
    if dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PAYLOAD_LOCK})


def recorded(session: Session, digests: Iterable[str]) -> set[str]:
    """Which of DIGESTS any record names (present or removed)."""
    names = list(digests)
    if not names:
        return set()
    rows = session.execute(
        select(artifacts.c.sha256).where(artifacts.c.sha256.in_(names)).distinct()
    )
    return {str(sha) for (sha,) in rows}


def live_totals(session: Session) -> tuple[int, int]:
    """How many payloads the records name as present, and their bytes."""
    per_payload = (
        select(func.max(artifacts.c.size).label("size"))
        .where(artifacts.c.removed_at.is_(None))
        .group_by(artifacts.c.sha256)
        .subquery()
    )
    count, total = session.execute(
        select(func.count(), func.coalesce(func.sum(per_payload.c.size), 0))
    ).one()
    return int(count), int(total)
