"""Copying a whole store to another database (SQLite to PostgreSQL, or back): every table
in dependency order, in batches, inside one write transaction on the target, which must
be at the same schema revision and hold no task, event or repository yet."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

from sqlalchemy import Connection, Integer, create_engine, func, insert, inspect, select
from sqlalchemy.exc import DBAPIError

from aiworker.store.backup import read_only_uri
from aiworker.store.engine import BUSY_TIMEOUT_MS, Database, explained, sqlite_path
from aiworker.store.schema import HEAD_REVISION, revision_on
from aiworker.store.tables import metadata

BATCH = 1000


def occupied(url: str) -> list[str]:
    """What keeps the database at URL from taking a copy, read before anything is written
    to it (a SQLite file is read read-only: its journal mode stays as it was): the
    tables of another application, a schema at another revision than this version's, or
    tables that hold rows. Empty: no tables at all, or this version's schema, empty."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return []
    try:
        with _reading(url) as connection:
            return _occupied(connection)
    except (sqlite3.DatabaseError, DBAPIError) as exc:
        if "not a database" in str(getattr(exc, "orig", exc)):
            return ["a file that is not a SQLite database"]
        named = explained(url, exc)  # locked past the busy timeout, unreadable
        if named is None:
            raise
        raise named from None


def _occupied(connection: Connection) -> list[str]:
    names = set(inspect(connection).get_table_names()) - {"alembic_version"}
    if not names:
        return []
    revision = revision_on(connection)
    foreign = sorted(names - set(metadata.tables))
    if foreign or revision is None:
        shown = ", ".join((foreign or sorted(names))[:5])
        return [f"tables of another application: {shown}"]
    if revision != HEAD_REVISION:
        return [f"aiworker's tables at revision {revision}, not {HEAD_REVISION}"]
    return [
        f"{table.name} holds rows"
        for table in metadata.sorted_tables
        if connection.scalar(select(func.count()).select_from(table))
    ]


@contextlib.contextmanager
def _reading(url: str) -> Iterator[Connection]:
    path = sqlite_path(url)
    if path is None:
        target = Database(url)
        try:
            with target.read_connection() as connection:
                yield connection
        finally:
            target.dispose()
        return
    engine = create_engine(
        "sqlite://",
        creator=lambda: sqlite3.connect(
            read_only_uri(path), uri=True, timeout=BUSY_TIMEOUT_MS / 1000
        ),
    )
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


def copy_rows(source: Database, target: Database) -> dict[str, int]:
    """Copy every row of SOURCE into TARGET in one transaction; returns rows per table.
    On PostgreSQL each id sequence then continues after the highest id copied."""
    counts: dict[str, int] = {}
    # One snapshot of the source: a row added between two tables' reads cannot arrive
    # without its parent.
    with source.read_connection(snapshot=True) as reading, target.transaction() as writing:
        for table in metadata.sorted_tables:
            counts[table.name] = 0
            ordered = select(table).order_by(*table.primary_key.columns)  # parents first
            result = reading.execution_options(yield_per=BATCH).execute(ordered)
            for batch in result.partitions():
                writing.execute(insert(table), [row._asdict() for row in batch])
                counts[table.name] += len(batch)
        if not target.sqlite:
            for table in metadata.sorted_tables:
                if "id" in table.c and isinstance(table.c.id.type, Integer):
                    highest = select(func.max(table.c.id)).scalar_subquery()
                    sequence = func.pg_get_serial_sequence(table.name, "id")
                    next_id = func.coalesce(highest, 0) + 1
                    writing.execute(select(func.setval(sequence, next_id, False)))
    return counts
