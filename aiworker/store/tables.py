"""The tables of DESIGN.md as SQLAlchemy Core tables: the schema itself.

The ORM classes in models.py map onto these. Paths that run on every scheduler
tick or claim use the tables directly: building Core tables costs a fifth of
declarative classes, and Core statements skip mapper configuration and the
ORM's compile step (benchmarks/tick).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = MetaData(naming_convention=NAMING)


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


def _id() -> Column[int]:
    return Column("id", Integer, primary_key=True)


def _at(name: str, *, required: bool = True) -> Column[datetime]:
    return Column(name, UTCDateTime(), nullable=not required, default=utcnow if required else None)


def _task_ref(*, index: bool = False, required: bool = False) -> Column[int]:
    return Column("task_id", Integer, ForeignKey("tasks.id"), nullable=not required, index=index)


repositories = Table(
    "repositories",
    metadata,
    _id(),
    Column("index", Integer, nullable=False, unique=True),
    Column("owner", String(100), nullable=False),
    Column("name", String(100), nullable=False),
    Column("settings", JSON, nullable=False, default=dict),
    _at("created_at"),
    UniqueConstraint("owner", "name"),
)

WAITING = text("claim_slot IS NULL AND state IN ('ready', 'repairing')")

tasks = Table(
    "tasks",
    metadata,
    _id(),
    Column("repository_id", Integer, ForeignKey("repositories.id"), nullable=False),
    Column("kind", String(16), nullable=False),  # plan | milestone | feature | issue
    Column("issue_number", Integer),
    Column("parent_id", Integer, ForeignKey("tasks.id")),
    Column("title", Text, nullable=False, default=""),
    Column("state", String(32), nullable=False),
    Column("version", Integer, nullable=False, default=1),
    Column("scope_fingerprint", String(64)),
    # What the task's authorisation covers: the scope as it stood when the timeline item
    # that authorised it (an assignment, a label) was first seen. An issue whose author
    # cannot authorise that changes beyond it needs a writer to authorise it again.
    Column("authorized_scope", String(64)),
    Column("authorized_item", BigInteger),
    Column("base_commit", String(64)),
    Column("head_commit", String(64)),
    Column("claim_slot", Integer),
    Column("claim_token", String(64)),
    Column("claim_host", String(128)),  # the controller.id whose slot holds the claim
    _at("claimed_at", required=False),
    _at("created_at"),
    _at("updated_at"),
    # A plan: its proposed milestones and approval; a milestone: its own specification.
    Column("spec", JSON),
    UniqueConstraint("repository_id", "kind", "issue_number"),
    Index("ix_tasks_state_id", "state", "id"),
    Index("ix_tasks_claim_slot", "claim_slot"),
    Index("ix_tasks_parent_id", "parent_id"),
    # The claim's candidates in id order, without walking past the claimed ones. The
    # migration (0006) gives PostgreSQL the same condition; naming postgresql_where here
    # would import SQLAlchemy's PostgreSQL dialect into every command on SQLite too
    # (25 ms of an idle tick's start-up; benchmarks/tick checks it stays out).
    Index("ix_tasks_waiting", "id", sqlite_where=WAITING),
)

# Each controller host sharing the database: its last sign of life. Another host's claims
# are recovered only once it has been silent for longer than the controller lease.
controllers = Table(
    "controllers",
    metadata,
    Column("id", String(128), primary_key=True),  # controller.id
    _at("seen_at"),
    _at("started_at"),
    # Where it runs (host, state directory, machine id): a second installation using the
    # same id while this one renews is refused (store/controllers.renew).
    Column("instance", Text, nullable=True),
    # Its own controller.lease in seconds: another waits at least this long for it.
    Column("lease_s", Integer, nullable=True),
)

attempts = Table(
    "attempts",
    metadata,
    _id(),
    _task_ref(index=True, required=True),
    Column("phase", String(32), nullable=False),
    Column("provider", String(32)),
    Column("model", String(100)),
    Column("effort", String(16)),
    Column("settings", JSON, nullable=False, default=dict),
    _at("started_at"),
    _at("finished_at", required=False),
    Column("outcome", String(32)),
    Column("refunded", Boolean, nullable=False, default=False),
    Column("prompt_path", Text),
    Column("result_path", Text),
    Column("log_path", Text),
    # Why it ended as it did, the process that ran it, and where its files are (or were).
    Column("reason", Text),
    Column("pid", Integer),
    Column("host", String(128)),  # the controller.id whose process runs it (pid is there)
    Column("workspace_path", Text),
    Index("ix_attempts_open", "finished_at"),
)

provider_observations = Table(
    "provider_observations",
    metadata,
    _id(),
    Column("provider", String(32), nullable=False),
    Column("window", String(64), nullable=False),
    Column("used_percent", Float),
    _at("resets_at", required=False),
    _at("observed_at"),
    Column("valid", Boolean, nullable=False),
    # Where the reading came from (a file, a command, the script's scenario path): any
    # length, which PostgreSQL enforces where SQLite never did.
    Column("source", Text, nullable=False),
    Column("reason", Text),
    Index("ix_provider_observations_latest", "provider", "observed_at"),
)

worker_jobs = Table(
    "worker_jobs",
    metadata,
    Column("repository_index", Integer, primary_key=True),
    Column("worker_job_index", Integer, primary_key=True),
    Column("request", JSON, nullable=False),
    Column("state", String(32), nullable=False),
    Column("version", Integer, nullable=False, default=1),
    Column("lease_token", String(64)),
    _at("lease_expires_at", required=False),
    Column("attempt_count", Integer, nullable=False, default=0),
    Column("result", JSON),
    # The claim's client request key: a retried claim after a lost reply gets this lease.
    Column("claim_key", String(128)),
    Column("worker_id", String(128)),
    # The attempt waiting for its delivery (none: a tool's): its recovery ends the job.
    Column("attempt_id", Integer),
    _at("created_at"),
    _at("updated_at"),
    Index("ix_worker_jobs_state_lease", "state", "lease_expires_at"),
)

receipts = Table(
    "receipts",
    metadata,
    _id(),
    _task_ref(),
    Column("phase", String(32), nullable=False),
    Column("head_commit", String(64), nullable=False),
    Column("base_commit", String(64), nullable=False),
    Column("scope_fingerprint", String(64)),
    Column("check_id", String(100)),
    Column("outcome", String(32), nullable=False),
    Column("body", JSON, nullable=False, default=dict),
    _at("created_at"),
    Index("ix_receipts_task_phase_head", "task_id", "phase", "head_commit"),
)

# The artifact store's records (runtime/artifact_files.py holds the payloads): each row
# is one reference to a payload by a task, an attempt, a receipt or a worker job. The
# retention pass removes a payload once every reference to it has expired and its task
# ended, and keeps the rows (removed_at set).
artifacts = Table(
    "artifacts",
    metadata,
    _id(),
    Column("sha256", String(64), nullable=False),
    Column("size", Integer, nullable=False),
    Column("media_type", String(100), nullable=False),
    Column("name", Text, nullable=False),
    _task_ref(index=True),
    Column("attempt_id", Integer, ForeignKey("attempts.id")),
    Column("receipt_id", Integer, ForeignKey("receipts.id"), index=True),
    Column("worker_job", String(64)),  # REPOSITORY_INDEX/JOB_INDEX
    _at("created_at"),
    _at("expires_at"),
    _at("removed_at", required=False),
    Index("ix_artifacts_sha256", "sha256"),
    Index("ix_artifacts_expires_at", "expires_at"),
)

publications = Table(
    "publications",
    metadata,
    _id(),
    _task_ref(index=True, required=True),
    Column("intent_id", String(64), nullable=False, unique=True),
    Column("ownership_marker", Text, nullable=False),
    Column("remote_branch", Text, nullable=False),
    Column("head_commit", String(64)),
    Column("pr_number", Integer),
    Column("state", String(32), nullable=False),
    _at("created_at"),
    _at("updated_at"),
)

# Append-only audit trail: task events are never updated or deleted; only scheduler
# check receipts (task_id NULL) are pruned to the latest N by the tick.
# The kinds of worker job events (store/worker_jobs.py), pruned by the tick.
WORKER_JOB_EVENTS = tuple(
    f"worker_job.{k}"
    for k in ("claimed", "finished", "expired", "released", "abandoned", "orphans_ended")
)

events = Table(
    "events",
    metadata,
    _id(),
    _task_ref(),
    Column("kind", String(64), nullable=False),
    Column("from_state", String(32)),
    Column("to_state", String(32)),
    Column("actor", String(100)),
    Column("data", JSON, nullable=False, default=dict),
    _at("created_at"),
    Index("ix_events_task_id", "task_id"),
    Index("ix_events_kind_id", "kind", "id"),
)

# Attempts and repair episodes used per task and phase; survives restarts and polls.
budgets = Table(
    "budgets",
    metadata,
    _id(),
    _task_ref(required=True),
    Column("phase", String(32), nullable=False),
    Column("used", Integer, nullable=False, default=0),
    Column("resets", Integer, nullable=False, default=0),
    _at("updated_at"),
    UniqueConstraint("task_id", "phase"),
)

cleanup_inventory = Table(
    "cleanup_inventory",
    metadata,
    _id(),
    _task_ref(index=True),
    Column("path", Text, nullable=False),
    Column("action", String(16), nullable=False),  # removed | kept
    Column("reason", Text),
    Column("bytes", Integer),
    _at("recorded_at"),
)
