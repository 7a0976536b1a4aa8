"""what each task's authorisation covers: the scope as it stood when the timeline item
that authorised it was first seen, and that item; an issue whose author cannot authorise
that changes beyond it waits for a writer to authorise it again. An existing task's
authorisation is recorded at its next poll, as it stands then: each repository's poll
cursor is cleared, so that the next poll is a full one and reaches every task.

Revision ID: 0008_authorized_scope
Revises: 0007_controller_instance
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_authorized_scope"
down_revision = "0007_controller_instance"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("authorized_scope", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("authorized_item", sa.BigInteger(), nullable=True))
    repositories = sa.table("repositories", sa.column("id"), sa.column("settings", sa.JSON()))
    bind = op.get_bind()
    for row in bind.execute(sa.select(repositories.c.id, repositories.c.settings)).all():
        settings = dict(row.settings or {})
        if settings.pop("poll", None) is not None:
            changed = sa.update(repositories).where(repositories.c.id == row.id)
            bind.execute(changed.values(settings=settings))


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("authorized_item")
        batch_op.drop_column("authorized_scope")
