"""which attempt waits for each worker job's delivery, so that a job whose waiter died
(its controller process killed while it waited for a runner) ends with that attempt's
recovery instead of staying queued for a runner to run for nobody

Revision ID: 0010_worker_job_waiter
Revises: 0009_mend_edited_migrations
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_worker_job_waiter"
down_revision = "0009_mend_edited_migrations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "attempt_id" in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("worker_jobs")}:
        return  # a store stamped older than its tables are (restored, or mended by hand)
    with op.batch_alter_table("worker_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("worker_jobs", schema=None) as batch_op:
        batch_op.drop_column("attempt_id")
