"""Typed SQLAlchemy models of the tables in DESIGN.md."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in Python, naive UTC in the database."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are not stored; use UTC-aware values")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON}


class Repository(Base):
    __tablename__ = "repositories"
    id: Mapped[int] = mapped_column(primary_key=True)
    index: Mapped[int] = mapped_column(Integer, unique=True)
    owner: Mapped[str] = mapped_column(String(100))
    name: Mapped[str] = mapped_column(String(100))
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    __table_args__ = (UniqueConstraint("owner", "name"),)


class Task(Base):
    __tablename__ = "tasks"
    id: Mapped[int] = mapped_column(primary_key=True)
    repository_id: Mapped[int] = mapped_column(ForeignKey("repositories.id"))
    kind: Mapped[str] = mapped_column(String(16))  # plan | milestone | feature | issue
    issue_number: Mapped[int | None]
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("tasks.id"))
    title: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(32))
    version: Mapped[int] = mapped_column(default=1)
    scope_fingerprint: Mapped[str | None] = mapped_column(String(64))
    base_commit: Mapped[str | None] = mapped_column(String(64))
    head_commit: Mapped[str | None] = mapped_column(String(64))
    claim_slot: Mapped[int | None]
    claim_token: Mapped[str | None] = mapped_column(String(64))
    claimed_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    __table_args__ = (
        UniqueConstraint("repository_id", "kind", "issue_number"),
        Index("ix_tasks_state_id", "state", "id"),
        Index("ix_tasks_claim_slot", "claim_slot"),
        Index("ix_tasks_parent_id", "parent_id"),
    )


class Attempt(Base):
    __tablename__ = "attempts"
    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    phase: Mapped[str] = mapped_column(String(32))
    provider: Mapped[str | None] = mapped_column(String(32))
    model: Mapped[str | None] = mapped_column(String(100))
    effort: Mapped[str | None] = mapped_column(String(16))
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    outcome: Mapped[str | None] = mapped_column(String(32))
    refunded: Mapped[bool] = mapped_column(Boolean, default=False)
    prompt_path: Mapped[str | None] = mapped_column(Text)
    result_path: Mapped[str | None] = mapped_column(Text)
    log_path: Mapped[str | None] = mapped_column(Text)


class ProviderObservation(Base):
    __tablename__ = "provider_observations"
    id: Mapped[int] = mapped_column(primary_key=True)
    provider: Mapped[str] = mapped_column(String(32))
    window: Mapped[str] = mapped_column(String(64))
    used_percent: Mapped[float | None] = mapped_column(Float)
    resets_at: Mapped[datetime | None]
    observed_at: Mapped[datetime] = mapped_column(default=utcnow)
    valid: Mapped[bool] = mapped_column(Boolean)
    source: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(Text)
    __table_args__ = (Index("ix_provider_observations_latest", "provider", "observed_at"),)


class WorkerJob(Base):
    __tablename__ = "worker_jobs"
    repository_index: Mapped[int] = mapped_column(primary_key=True)
    worker_job_index: Mapped[int] = mapped_column(primary_key=True)
    request: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(32))
    version: Mapped[int] = mapped_column(default=1)
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None]
    attempt_count: Mapped[int] = mapped_column(default=0)
    result: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    __table_args__ = (Index("ix_worker_jobs_state_lease", "state", "lease_expires_at"),)


class Receipt(Base):
    __tablename__ = "receipts"
    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int | None] = mapped_column(ForeignKey("tasks.id"))
    phase: Mapped[str] = mapped_column(String(32))
    head_commit: Mapped[str] = mapped_column(String(64))
    base_commit: Mapped[str] = mapped_column(String(64))
    scope_fingerprint: Mapped[str | None] = mapped_column(String(64))
    check_id: Mapped[str | None] = mapped_column(String(100))
    outcome: Mapped[str] = mapped_column(String(32))
    body: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    __table_args__ = (Index("ix_receipts_task_phase_head", "task_id", "phase", "head_commit"),)


class Publication(Base):
    __tablename__ = "publications"
    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    intent_id: Mapped[str] = mapped_column(String(64), unique=True)
    ownership_marker: Mapped[str] = mapped_column(Text)
    remote_branch: Mapped[str] = mapped_column(Text)
    head_commit: Mapped[str | None] = mapped_column(String(64))
    pr_number: Mapped[int | None]
    state: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Event(Base):
    """Append-only audit trail; rows are never updated or deleted."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int | None] = mapped_column(ForeignKey("tasks.id"))
    kind: Mapped[str] = mapped_column(String(64))
    from_state: Mapped[str | None] = mapped_column(String(32))
    to_state: Mapped[str | None] = mapped_column(String(32))
    actor: Mapped[str | None] = mapped_column(String(100))
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    __table_args__ = (
        Index("ix_events_task_id", "task_id"),
        Index("ix_events_kind_id", "kind", "id"),
    )


class CleanupItem(Base):
    __tablename__ = "cleanup_inventory"
    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int | None] = mapped_column(ForeignKey("tasks.id"), index=True)
    path: Mapped[str] = mapped_column(Text)
    action: Mapped[str] = mapped_column(String(16))  # removed | kept
    reason: Mapped[str | None] = mapped_column(Text)
    bytes: Mapped[int | None]
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)
