"""which attempt waits for each worker job's delivery, so that a job whose waiter died
(its controller process killed while it waited for a runner) ends with that attempt's
recovery instead of staying queued for a runner to run for nobody. A job still open as
this runs has no waiter left to read it (a migration runs only while no work runs: its
step died before the upgrade) and none to be recorded: it ends failed, saying so.

Revision ID: 0010_worker_job_waiter
Revises: 0009_mend_edited_migrations
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0010_worker_job_waiter"
down_revision = "0009_mend_edited_migrations"
branch_labels = None
depends_on = None


ORPHANED = "its controller's step ended before the upgrade that records who awaits a job"


def upgrade() -> None:
    bind = op.get_bind()
    jobs = sa.table(
        "worker_jobs",
        sa.column("state", sa.String()),
        sa.column("lease_token", sa.String()),
        sa.column("result", sa.JSON()),
        sa.column("version", sa.Integer()),
        sa.column("updated_at", sa.DateTime()),
    )
    now = datetime.now(UTC).replace(tzinfo=None)  # naive UTC, as the store keeps times
    ended = {"state": "failed", "lease_token": None, "result": {"error": ORPHANED}}
    bind.execute(
        sa.update(jobs)
        .where(jobs.c.state.in_(("queued", "leased")))
        .values(**ended, version=jobs.c.version + 1, updated_at=now)
    )
    if "attempt_id" in {c["name"] for c in sa.inspect(bind).get_columns("worker_jobs")}:
        return  # a store stamped older than its tables are (restored, or mended by hand)
    with op.batch_alter_table("worker_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("worker_jobs", schema=None) as batch_op:
        batch_op.drop_column("attempt_id")
