"""the artifact store's records: one row per reference to a content-addressed payload

Revision ID: 0005_artifacts
Revises: 0004_worker_leases
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_artifacts"
down_revision = "0004_worker_leases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("media_type", sa.String(length=100), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("attempt_id", sa.Integer(), nullable=True),
        sa.Column("receipt_id", sa.Integer(), nullable=True),
        sa.Column("worker_job", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("removed_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["attempts.id"], name=op.f("fk_artifacts_attempt_id_attempts")
        ),
        sa.ForeignKeyConstraint(
            ["receipt_id"], ["receipts.id"], name=op.f("fk_artifacts_receipt_id_receipts")
        ),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_artifacts_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifacts")),
    )
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.create_index("ix_artifacts_sha256", ["sha256"], unique=False)
        batch_op.create_index("ix_artifacts_expires_at", ["expires_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_artifacts_task_id"), ["task_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_artifacts_receipt_id"), ["receipt_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_artifacts_receipt_id"))
        batch_op.drop_index(batch_op.f("ix_artifacts_task_id"))
        batch_op.drop_index("ix_artifacts_expires_at")
        batch_op.drop_index("ix_artifacts_sha256")
    op.drop_table("artifacts")
