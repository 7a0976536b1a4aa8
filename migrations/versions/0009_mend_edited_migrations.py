"""mend what edited migrations left out: 0006 and 0007 were changed after their first
version had run, so a store migrated by that first version is stamped with their revision
yet lacks the change (controllers.lease_s; on PostgreSQL a provider reading's source
wider than 64 characters), and 0008's first version recorded each authorisation as the
issue's whole scope, which its final version never matches. What is missing is added;
an authorisation in the old form is cleared, with the poll cursors, so that the next
full poll records it as the issue stands then, as 0008 does. A store that has it all
is left as it is.

Revision ID: 0009_mend_edited_migrations
Revises: 0008_authorized_scope
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_mend_edited_migrations"
down_revision = "0008_authorized_scope"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    if "lease_s" not in {c["name"] for c in inspector.get_columns("controllers")}:
        with op.batch_alter_table("controllers", schema=None) as batch_op:
            batch_op.add_column(sa.Column("lease_s", sa.Integer(), nullable=True))
    source = {c["name"]: c["type"] for c in inspector.get_columns("provider_observations")}
    if bind.dialect.name == "postgresql" and getattr(source["source"], "length", None):
        op.alter_column(
            "provider_observations",
            "source",
            existing_type=source["source"],
            type_=sa.Text(),
            existing_nullable=False,
        )
    tasks = sa.table("tasks", sa.column("authorized_scope"), sa.column("scope_fingerprint"))
    old_form = tasks.c.authorized_scope == tasks.c.scope_fingerprint
    cleared = bind.execute(sa.update(tasks).where(old_form).values(authorized_scope=None))
    if cleared.rowcount:
        repositories = sa.table("repositories", sa.column("id"), sa.column("settings", sa.JSON()))
        for row in bind.execute(sa.select(repositories.c.id, repositories.c.settings)).all():
            settings = dict(row.settings or {})
            if settings.pop("poll", None) is not None:
                changed = sa.update(repositories).where(repositories.c.id == row.id)
                bind.execute(changed.values(settings=settings))


def downgrade() -> None:
    pass  # what it added belongs to the revisions below; nothing to take back
