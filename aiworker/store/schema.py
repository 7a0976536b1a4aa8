"""Schema revisions: a cheap check on every open, alembic only to migrate.

Importing alembic costs more than an idle scheduler tick may spend, so the
check reads the alembic_version table directly against the revisions this code
knows; a test pins KNOWN_REVISIONS to the migration scripts.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from aiworker.errors import AiworkerError, DiskFull, SchemaMismatch, StateUnusable
from aiworker.store.engine import Database, explained, sqlite_path

# Oldest first; the last one is the head this code runs against.
KNOWN_REVISIONS = (
    "0001_initial",
    "0002_lifecycle",
    "0003_plans",
    "0004_worker_leases",
    "0005_artifacts",
    "0006_controllers",
    "0007_controller_instance",
    "0008_authorized_scope",
    "0009_mend_edited_migrations",
    "0010_worker_job_waiter",
)
HEAD_REVISION = KNOWN_REVISIONS[-1]


def current_revision(db: Database) -> str | None:
    with db.explaining(), db.engine.connect() as conn:
        return revision_on(conn)


def revision_on(conn: Connection) -> str | None:
    if not inspect(conn).has_table("alembic_version"):
        return None
    row = conn.execute(text("SELECT version_num FROM alembic_version")).first()
    return None if row is None else str(row[0])


def ensure_not_newer(revision: str | None) -> None:
    if revision is None or revision in KNOWN_REVISIONS:
        return
    number = revision.partition("_")[0]
    if number.isdigit() and int(number) > int(HEAD_REVISION.partition("_")[0]):
        raise SchemaMismatch(
            f"database schema revision {revision} is newer than this aiworker "
            f"(which knows up to {HEAD_REVISION}); upgrade aiworker before using this database"
        )
    # Not one of ours, nor a later one of ours: another program's, or a hand edit.
    raise SchemaMismatch(
        f"database schema revision {revision[:100]!r} is not one this aiworker knows "
        f"({KNOWN_REVISIONS[0]} to {HEAD_REVISION}); it may not be an aiworker database"
    )


def not_initialised(url: str) -> SchemaMismatch:
    return SchemaMismatch(f"database {url} is not initialised; run `aiworker db upgrade` first")


def ensure_current(db: Database) -> None:
    try:
        revision = current_revision(db)
    except DBAPIError as exc:
        named = explained(db.url, exc)
        if named is not None and (not isinstance(named, StateUnusable) or not db.sqlite):
            raise named from None  # passing: a full disk, a lock held too long, no slot
        where = sqlite_path(db.url) or "the database"
        raise StateUnusable(f"{where}: cannot be used: {exc.orig}") from None
    ensure_not_newer(revision)
    if revision is None:
        raise not_initialised(db.url)
    if revision != HEAD_REVISION:
        raise SchemaMismatch(
            f"database schema revision {revision} is older than this aiworker "
            f"({HEAD_REVISION}); run `aiworker db upgrade`"
        )


def probe_file(path: Path) -> None:
    """Refuse a file that is not an aiworker database, or one newer than this code, before
    anything touches it (the engine's connect hook switches the journal to WAL).

    Only SQLite opens the file here, never a plain open(): closing any descriptor of a file
    drops every POSIX lock this process holds on it, the shared lock of a connection that
    is open on the same database included (a tick opens the store again to poll). Another
    process would then take the database for unused, checkpoint it and delete its WAL
    under this one, whose later commits are lost or overwrite others' pages. SQLite's own
    connections share its record of the locks and keep such a descriptor open.

    The revision is read without writing: when no connection has the database open (no
    -shm file) as an immutable file, which takes no lock and creates nothing; otherwise
    read-only through SQLite's locks, which is what a database that another process is
    writing needs."""
    if not os.access(path, os.R_OK):
        raise StateUnusable(f"{path}: cannot be read: permission denied")
    quiet = not Path(f"{path}-shm").exists()
    try:
        revision = _read_revision(path, immutable=quiet)
    except sqlite3.DatabaseError as exc:
        if not quiet:
            raise _unusable(path, exc) from None
        try:  # a writer may have opened it meanwhile: read it as a live database
            revision = _read_revision(path, immutable=False)
        except sqlite3.DatabaseError as again:
            raise _unusable(path, again) from None
    ensure_not_newer(revision)


def _unusable(path: Path, exc: sqlite3.DatabaseError) -> AiworkerError:
    """Why the database at PATH could not be read: a full disk (SQLite cannot make or grow
    the shared-memory file a live database is read through, and says I/O error) is one
    to free space on, not a damaged store."""
    named = explained(f"sqlite:///{path}", exc)
    if isinstance(named, DiskFull):
        return named
    return StateUnusable(f"{path}: not a usable aiworker database ({exc})")


def _read_revision(path: Path, *, immutable: bool) -> str | None:
    mode = "ro&immutable=1" if immutable else "ro"
    connection = sqlite3.connect(f"file:{quote(str(path.absolute()))}?mode={mode}", uri=True)
    try:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        if "alembic_version" not in tables:
            return None
        row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    finally:
        connection.close()
    return None if row is None else str(row[0])


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

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    # One write transaction: two hosts upgrading one PostgreSQL database take turns on the
    # write lock, and the second finds the first one's work done.
    with db.explaining(), db.write_engine.begin() as conn:
        before = revision_on(conn)
        ensure_not_newer(before)
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
    return before, HEAD_REVISION


def schema_drift(db: Database) -> list[str]:
    """How the store's tables differ from this version's (a migration edited after it ran,
    a change by hand), one phrase each; empty when they agree. Tables of another
    application sharing the database are not ours to judge."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from aiworker.store.models import Base

    with db.engine.connect() as connection:
        found = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    ours = set(Base.metadata.tables)
    firsts = [item[0] if isinstance(item, list) else item for item in found]
    return [_difference(first) for first in firsts if _table_of(first) in ours]


def _table_of(item: tuple[Any, ...]) -> str | None:
    """The table a difference is about: (kind, schema, table, ...) for a column's, else
    the table, or the index or constraint of one, second."""
    if item[0].endswith("_column") or item[0].startswith("modify_"):
        return str(item[2])
    table = getattr(item[1], "table", item[1])
    return getattr(table, "name", None)


def _difference(item: tuple[Any, ...]) -> str:
    kind = item[0]
    if kind in ("add_column", "remove_column"):
        where = f"{item[2]}.{item[3].name}"
        return f"{'no' if kind == 'add_column' else 'an unknown'} column {where}"
    if kind in ("add_table", "remove_table"):
        return f"{'no' if kind == 'add_table' else 'an unknown'} table {item[1].name}"
    if kind == "modify_type":
        return f"{item[2]}.{item[3]} is {item[5]}, not {item[6]}"
    return f"{kind} {' '.join(str(getattr(part, 'name', part)) for part in item[1:3])}"
