"""where each controller runs (host, state directory, machine id), so that two
installations claiming one controller.id are told apart and the second refused, and the
lease each renews within, so that others wait for it as long as it asks

Revision ID: 0007_controller_instance
Revises: 0006_controllers
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_controller_instance"
down_revision = "0006_controllers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("controllers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("instance", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("lease_s", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("controllers", schema=None) as batch_op:
        batch_op.drop_column("lease_s")
        batch_op.drop_column("instance")
