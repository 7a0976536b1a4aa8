"""initial schema

Revision ID: 0001_initial
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "provider_observations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("window", sa.String(length=64), nullable=False),
        sa.Column("used_percent", sa.Float(), nullable=True),
        sa.Column("resets_at", sa.DateTime(), nullable=True),
        sa.Column("observed_at", sa.DateTime(), nullable=False),
        sa.Column("valid", sa.Boolean(), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_provider_observations")),
    )
    with op.batch_alter_table("provider_observations", schema=None) as batch_op:
        batch_op.create_index(
            "ix_provider_observations_latest", ["provider", "observed_at"], unique=False
        )

    op.create_table(
        "repositories",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=100), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_repositories")),
        sa.UniqueConstraint("index", name=op.f("uq_repositories_index")),
        sa.UniqueConstraint("owner", "name", name=op.f("uq_repositories_owner_name")),
    )
    op.create_table(
        "worker_jobs",
        sa.Column("repository_index", sa.Integer(), nullable=False),
        sa.Column("worker_job_index", sa.Integer(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("lease_token", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint(
            "repository_index", "worker_job_index", name=op.f("pk_worker_jobs")
        ),
    )
    with op.batch_alter_table("worker_jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_worker_jobs_state_lease", ["state", "lease_expires_at"], unique=False
        )

    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("repository_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("issue_number", sa.Integer(), nullable=True),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("scope_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("base_commit", sa.String(length=64), nullable=True),
        sa.Column("head_commit", sa.String(length=64), nullable=True),
        sa.Column("claim_slot", sa.Integer(), nullable=True),
        sa.Column("claim_token", sa.String(length=64), nullable=True),
        sa.Column("claimed_at", sa.DateTime(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["parent_id"], ["tasks.id"], name=op.f("fk_tasks_parent_id_tasks")),
        sa.ForeignKeyConstraint(
            ["repository_id"], ["repositories.id"], name=op.f("fk_tasks_repository_id_repositories")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tasks")),
        sa.UniqueConstraint(
            "repository_id",
            "kind",
            "issue_number",
            name=op.f("uq_tasks_repository_id_kind_issue_number"),
        ),
    )
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.create_index("ix_tasks_claim_slot", ["claim_slot"], unique=False)
        batch_op.create_index("ix_tasks_parent_id", ["parent_id"], unique=False)
        batch_op.create_index("ix_tasks_state_id", ["state", "id"], unique=False)

    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(length=32), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=True),
        sa.Column("model", sa.String(length=100), nullable=True),
        sa.Column("effort", sa.String(length=16), nullable=True),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("outcome", sa.String(length=32), nullable=True),
        sa.Column("refunded", sa.Boolean(), nullable=False),
        sa.Column("prompt_path", sa.Text(), nullable=True),
        sa.Column("result_path", sa.Text(), nullable=True),
        sa.Column("log_path", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_attempts_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_attempts_task_id"), ["task_id"], unique=False)

    op.create_table(
        "cleanup_inventory",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("bytes", sa.Integer(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name=op.f("fk_cleanup_inventory_task_id_tasks")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cleanup_inventory")),
    )
    with op.batch_alter_table("cleanup_inventory", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_cleanup_inventory_task_id"), ["task_id"], unique=False)

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("from_state", sa.String(length=32), nullable=True),
        sa.Column("to_state", sa.String(length=32), nullable=True),
        sa.Column("actor", sa.String(length=100), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_events_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_kind_id", ["kind", "id"], unique=False)
        batch_op.create_index("ix_events_task_id", ["task_id"], unique=False)

    op.create_table(
        "publications",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("intent_id", sa.String(length=64), nullable=False),
        sa.Column("ownership_marker", sa.Text(), nullable=False),
        sa.Column("remote_branch", sa.Text(), nullable=False),
        sa.Column("head_commit", sa.String(length=64), nullable=True),
        sa.Column("pr_number", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["task_id"], ["tasks.id"], name=op.f("fk_publications_task_id_tasks")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_publications")),
        sa.UniqueConstraint("intent_id", name=op.f("uq_publications_intent_id")),
    )
    with op.batch_alter_table("publications", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_publications_task_id"), ["task_id"], unique=False)

    op.create_table(
        "receipts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("phase", sa.String(length=32), nullable=False),
        sa.Column("head_commit", sa.String(length=64), nullable=False),
        sa.Column("base_commit", sa.String(length=64), nullable=False),
        sa.Column("scope_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("check_id", sa.String(length=100), nullable=True),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_receipts_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_receipts")),
    )
    with op.batch_alter_table("receipts", schema=None) as batch_op:
        batch_op.create_index(
            "ix_receipts_task_phase_head", ["task_id", "phase", "head_commit"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("receipts", schema=None) as batch_op:
        batch_op.drop_index("ix_receipts_task_phase_head")

    op.drop_table("receipts")
    with op.batch_alter_table("publications", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_publications_task_id"))

    op.drop_table("publications")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_task_id")
        batch_op.drop_index("ix_events_kind_id")

    op.drop_table("events")
    with op.batch_alter_table("cleanup_inventory", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_cleanup_inventory_task_id"))

    op.drop_table("cleanup_inventory")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_attempts_task_id"))

    op.drop_table("attempts")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_tasks_state_id")
        batch_op.drop_index("ix_tasks_parent_id")
        batch_op.drop_index("ix_tasks_claim_slot")

    op.drop_table("tasks")
    with op.batch_alter_table("worker_jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_worker_jobs_state_lease")

    op.drop_table("worker_jobs")
    op.drop_table("repositories")
    with op.batch_alter_table("provider_observations", schema=None) as batch_op:
        batch_op.drop_index("ix_provider_observations_latest")

    op.drop_table("provider_observations")
