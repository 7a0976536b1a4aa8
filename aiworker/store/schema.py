"""Schema revisions: a cheap check on every open, alembic only to migrate.

Importing alembic costs more than an idle scheduler tick may spend, so the
check reads the alembic_version table directly against the revisions this code
knows; a test pins KNOWN_REVISIONS to the migration scripts.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect, text

from aiworker.errors import SchemaMismatch
from aiworker.store.engine import Database

# Oldest first; the last one is the head this code runs against.
KNOWN_REVISIONS = ("0001_initial", "0002_lifecycle")
HEAD_REVISION = KNOWN_REVISIONS[-1]


def current_revision(db: Database) -> str | None:
    with db.engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        row = conn.execute(text("SELECT version_num FROM alembic_version")).first()
        return None if row is None else str(row[0])


def ensure_not_newer(revision: str | None) -> None:
    if revision is not None and revision not in KNOWN_REVISIONS:
        raise SchemaMismatch(
            f"database schema revision {revision} is newer than this aiworker "
            f"(which knows up to {HEAD_REVISION}); upgrade aiworker before using this database"
        )


def ensure_current(db: Database) -> None:
    revision = current_revision(db)
    ensure_not_newer(revision)
    if revision is None:
        raise SchemaMismatch(
            f"database {db.url} is not initialised; run `aiworker db upgrade` first"
        )
    if revision != HEAD_REVISION:
        raise SchemaMismatch(
            f"database schema revision {revision} is older than this aiworker "
            f"({HEAD_REVISION}); run `aiworker db upgrade`"
        )


def migrations_dir() -> Path:
    """Inside a wheel the scripts ship as aiworker/_migrations; in a checkout, at the top."""
    packaged = Path(__file__).resolve().parent.parent / "_migrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "migrations"


def upgrade(db: Database) -> tuple[str | None, str]:
    """Create or migrate to head; return (revision before, revision after)."""
    from alembic import command
    from alembic.config import Config

    before = current_revision(db)
    ensure_not_newer(before)
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    with db.write_engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
    return before, HEAD_REVISION
