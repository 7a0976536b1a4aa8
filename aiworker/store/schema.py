"""Schema revisions: a cheap check on every open, alembic only to migrate.

Importing alembic costs more than an idle scheduler tick may spend, so the
check reads the alembic_version table directly against the revisions this code
knows; a test pins KNOWN_REVISIONS to the migration scripts.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import inspect, text
from sqlalchemy.exc import DBAPIError

from aiworker.errors import SchemaMismatch, StateUnusable
from aiworker.store.engine import Database, sqlite_path

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
    try:
        revision = current_revision(db)
    except DBAPIError as exc:
        where = sqlite_path(db.url) or "the database"
        raise StateUnusable(f"{where}: cannot be used: {exc.orig}") from None
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


def probe_file(path: Path) -> None:
    """Refuse a file that is not an aiworker database, or one newer than this code, before
    anything touches it: read-only and immutable, so no journal switch, no -wal or -shm
    file and no lock happen first (the engine's connect hook would write)."""
    uri = f"file:{quote(str(path.absolute()))}?mode=ro&immutable=1"
    try:
        connection = sqlite3.connect(uri, uri=True)
        try:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
            row = (
                connection.execute("SELECT version_num FROM alembic_version").fetchone()
                if "alembic_version" in tables
                else None
            )
        finally:
            connection.close()
    except sqlite3.DatabaseError as exc:
        raise StateUnusable(f"{path}: not a usable aiworker database ({exc})") from None
    ensure_not_newer(None if row is None else str(row[0]))


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
