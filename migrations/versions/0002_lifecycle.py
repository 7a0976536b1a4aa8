"""the task lifecycle: why and where attempts ended, and budgets per task and phase

Revision ID: 0002_lifecycle
Revises: 0001_initial
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_lifecycle"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("workspace_path", sa.Text(), nullable=True))
        batch_op.create_index("ix_attempts_open", ["finished_at"], unique=False)

    op.create_table(
        "budgets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(length=32), nullable=False),
        sa.Column("used", sa.Integer(), nullable=False),
        sa.Column("resets", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_budgets_task_id_tasks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budgets")),
        sa.UniqueConstraint("task_id", "phase", name=op.f("uq_budgets_task_id_phase")),
    )


def downgrade() -> None:
    op.drop_table("budgets")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_attempts_open")
        batch_op.drop_column("workspace_path")
        batch_op.drop_column("pid")
        batch_op.drop_column("reason")
