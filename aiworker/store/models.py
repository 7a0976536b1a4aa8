"""ORM classes mapped onto the Core tables in tables.py.

Commands that read or create whole rows use these; the scheduler tick and the
claim path use the tables directly and never import this module.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import DeclarativeBase

from aiworker.store import tables
from aiworker.store.tables import utcnow

__all__ = [
    "Attempt",
    "Base",
    "CleanupItem",
    "Event",
    "ProviderObservation",
    "Publication",
    "Receipt",
    "Repository",
    "Task",
    "WorkerJob",
    "utcnow",
]

if TYPE_CHECKING:
    from sqlalchemy.orm import Mapped


class Base(DeclarativeBase):
    metadata = tables.metadata


# Attribute types are declared for the type checker only: the columns come from
# the tables, so nothing here is evaluated at import.


class Repository(Base):
    __table__ = tables.repositories
    if TYPE_CHECKING:
        id: Mapped[int]
        index: Mapped[int]
        owner: Mapped[str]
        name: Mapped[str]
        settings: Mapped[dict[str, Any]]
        created_at: Mapped[datetime]


class Task(Base):
    __table__ = tables.tasks
    if TYPE_CHECKING:
        id: Mapped[int]
        repository_id: Mapped[int]
        kind: Mapped[str]
        issue_number: Mapped[int | None]
        parent_id: Mapped[int | None]
        title: Mapped[str]
        state: Mapped[str]
        version: Mapped[int]
        scope_fingerprint: Mapped[str | None]
        authorized_scope: Mapped[str | None]
        authorized_item: Mapped[int | None]
        base_commit: Mapped[str | None]
        head_commit: Mapped[str | None]
        claim_slot: Mapped[int | None]
        claim_token: Mapped[str | None]
        claim_host: Mapped[str | None]
        claimed_at: Mapped[datetime | None]
        created_at: Mapped[datetime]
        updated_at: Mapped[datetime]
        spec: Mapped[dict[str, Any] | None]


class Attempt(Base):
    __table__ = tables.attempts
    if TYPE_CHECKING:
        id: Mapped[int]
        task_id: Mapped[int]
        phase: Mapped[str]
        provider: Mapped[str | None]
        model: Mapped[str | None]
        effort: Mapped[str | None]
        settings: Mapped[dict[str, Any]]
        started_at: Mapped[datetime]
        finished_at: Mapped[datetime | None]
        outcome: Mapped[str | None]
        refunded: Mapped[bool]
        prompt_path: Mapped[str | None]
        result_path: Mapped[str | None]
        log_path: Mapped[str | None]
        reason: Mapped[str | None]
        pid: Mapped[int | None]
        host: Mapped[str | None]
        workspace_path: Mapped[str | None]


class ProviderObservation(Base):
    __table__ = tables.provider_observations
    if TYPE_CHECKING:
        id: Mapped[int]
        provider: Mapped[str]
        window: Mapped[str]
        used_percent: Mapped[float | None]
        resets_at: Mapped[datetime | None]
        observed_at: Mapped[datetime]
        valid: Mapped[bool]
        source: Mapped[str]
        reason: Mapped[str | None]


class WorkerJob(Base):
    __table__ = tables.worker_jobs
    if TYPE_CHECKING:
        repository_index: Mapped[int]
        worker_job_index: Mapped[int]
        request: Mapped[dict[str, Any]]
        state: Mapped[str]
        version: Mapped[int]
        lease_token: Mapped[str | None]
        lease_expires_at: Mapped[datetime | None]
        attempt_count: Mapped[int]
        result: Mapped[dict[str, Any] | None]
        claim_key: Mapped[str | None]
        worker_id: Mapped[str | None]
        attempt_id: Mapped[int | None]
        created_at: Mapped[datetime]
        updated_at: Mapped[datetime]


class Receipt(Base):
    __table__ = tables.receipts
    if TYPE_CHECKING:
        id: Mapped[int]
        task_id: Mapped[int | None]
        phase: Mapped[str]
        head_commit: Mapped[str]
        base_commit: Mapped[str]
        scope_fingerprint: Mapped[str | None]
        check_id: Mapped[str | None]
        outcome: Mapped[str]
        body: Mapped[dict[str, Any]]
        created_at: Mapped[datetime]


class Publication(Base):
    __table__ = tables.publications
    if TYPE_CHECKING:
        id: Mapped[int]
        task_id: Mapped[int]
        intent_id: Mapped[str]
        ownership_marker: Mapped[str]
        remote_branch: Mapped[str]
        head_commit: Mapped[str | None]
        pr_number: Mapped[int | None]
        state: Mapped[str]
        created_at: Mapped[datetime]
        updated_at: Mapped[datetime]


class Event(Base):
    """Append-only audit trail; rows are never updated or deleted."""

    __table__ = tables.events
    if TYPE_CHECKING:
        id: Mapped[int]
        task_id: Mapped[int | None]
        kind: Mapped[str]
        from_state: Mapped[str | None]
        to_state: Mapped[str | None]
        actor: Mapped[str | None]
        data: Mapped[dict[str, Any]]
        created_at: Mapped[datetime]


class CleanupItem(Base):
    __table__ = tables.cleanup_inventory
    if TYPE_CHECKING:
        id: Mapped[int]
        task_id: Mapped[int | None]
        path: Mapped[str]
        action: Mapped[str]
        reason: Mapped[str | None]
        bytes: Mapped[int | None]
        recorded_at: Mapped[datetime]


class Budget(Base):
    __table__ = tables.budgets
    if TYPE_CHECKING:
        id: Mapped[int]
        task_id: Mapped[int]
        phase: Mapped[str]
        used: Mapped[int]
        resets: Mapped[int]
        updated_at: Mapped[datetime]
