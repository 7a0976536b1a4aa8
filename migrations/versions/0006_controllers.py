"""several controllers on one database: which host holds each claim and runs each
attempt, each controller's last sign of life, an index of the tasks waiting for a claim,
and a reading's source of any length (PostgreSQL enforces VARCHAR lengths)

Revision ID: 0006_controllers
Revises: 0005_artifacts
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_controllers"
down_revision = "0005_artifacts"
branch_labels = None
depends_on = None

WAITING = sa.text("claim_slot IS NULL AND state IN ('ready', 'repairing')")


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claim_host", sa.String(length=128), nullable=True))
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("host", sa.String(length=128), nullable=True))
    op.create_index(
        "ix_tasks_waiting", "tasks", ["id"], sqlite_where=WAITING, postgresql_where=WAITING
    )
    with op.batch_alter_table("provider_observations", schema=None) as batch_op:
        batch_op.alter_column(
            "source", existing_type=sa.String(length=64), type_=sa.Text(), existing_nullable=False
        )
    op.create_table(
        "controllers",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("seen_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_controllers")),
    )


def downgrade() -> None:
    op.drop_table("controllers")
    with op.batch_alter_table("provider_observations", schema=None) as batch_op:
        batch_op.alter_column(
            "source", existing_type=sa.Text(), type_=sa.String(length=64), existing_nullable=False
        )
    op.drop_index("ix_tasks_waiting", table_name="tasks")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("host")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("claim_host")
