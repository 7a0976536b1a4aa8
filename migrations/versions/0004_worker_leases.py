"""worker job leases: the claim's request key (a retried claim gets the same lease) and
the worker that holds it

Revision ID: 0004_worker_leases
Revises: 0003_plans
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_worker_leases"
down_revision = "0003_plans"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("worker_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claim_key", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("worker_id", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("worker_jobs", schema=None) as batch_op:
        batch_op.drop_column("worker_id")
        batch_op.drop_column("claim_key")
