"""plans: a plan's proposed milestones and a milestone's own specification on its task

Revision ID: 0003_plans
Revises: 0002_lifecycle
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_plans"
down_revision = "0002_lifecycle"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("spec", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("spec")
