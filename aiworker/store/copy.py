"""Copying a whole store to another database (SQLite to PostgreSQL, or back): every table
in dependency order, in batches, inside one write transaction on the target, which must
be at the same schema revision and hold no task, event or repository yet."""

from __future__ import annotations

from sqlalchemy import Integer, func, insert, select

from aiworker.store.engine import Database
from aiworker.store.tables import metadata

BATCH = 1000


def occupied(target: Database) -> list[str]:
    """The target's tables that already hold rows (alembic's own excepted)."""
    with target.read_connection() as connection:
        return [
            table.name
            for table in metadata.sorted_tables
            if connection.scalar(select(func.count()).select_from(table))
        ]


def copy_rows(source: Database, target: Database) -> dict[str, int]:
    """Copy every row of SOURCE into TARGET in one transaction; returns rows per table.
    On PostgreSQL each id sequence then continues after the highest id copied."""
    counts: dict[str, int] = {}
    with source.read_connection() as reading, target.transaction() as writing:
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
