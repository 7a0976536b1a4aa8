"""`aiworker db`: create, migrate, inspect and back up the database."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit

app = typer.Typer(
    help="Create, migrate, inspect and back up the database.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@app.command("upgrade")
def upgrade(ctx: typer.Context) -> None:
    """Create the database, or migrate it to this version's schema."""
    from aiworker.core.maintenance.database import upgrade_database

    inv: Invocation = ctx.obj
    report = upgrade_database(inv.environment()).to_json()

    def human(console: Any) -> None:
        if report["before"] == report["current"]:
            console.print(f"{report['database']}: already at {report['current']}", markup=False)
        else:
            before = report["before"] or "empty"
            console.print(f"{report['database']}: {before} -> {report['current']}", markup=False)

    emit(inv.json, report, human)


@app.command("current")
def current(ctx: typer.Context) -> None:
    """Show the database's schema revision and this version's head."""
    from aiworker.core.maintenance.database import database_revision

    inv: Invocation = ctx.obj
    report = database_revision(inv.environment()).to_json()
    line = f"{report['database']}: {report['current'] or 'not initialised'} (head {report['head']})"
    emit(inv.json, report, lambda c: c.print(line, markup=False))


@app.command("backup")
def backup(
    ctx: typer.Context,
    to: Annotated[Path, typer.Option("--to", help="New absolute path for the snapshot.")],
    with_artifacts: Annotated[
        Path | None,
        typer.Option(
            "--with-artifacts",
            help="Also copy every payload the snapshot names into this new or empty "
            "directory (admission is paused while both are taken).",
        ),
    ] = None,
) -> None:
    """Write a consistent snapshot of the live database to a new 0600 file, and with
    --with-artifacts the artifact store's payloads it names, for `aiworker restore`. On
    PostgreSQL the snapshot is pg_dump's custom format, checked with `pg_restore --list`."""
    from aiworker.core.maintenance.backup import backup_database
    from aiworker.runtime.interrupts import signals_raise

    inv: Invocation = ctx.obj
    with signals_raise():  # stopped, it removes what it had begun (then exits 143)
        report = backup_database(inv.environment(), to, with_artifacts).to_json()
    line = f"backed up {report['source']} to {report['target']} ({report['bytes']} bytes)"
    if report["artifacts"]:
        kept = report["artifacts"]
        line += f"; {kept['payloads']} payloads ({kept['bytes']} bytes) to {kept['dir']}"
    emit(inv.json, report, lambda c: c.print(line, markup=False))


@app.command("copy")
def copy(
    ctx: typer.Context,
    to: Annotated[
        str,
        typer.Option("--to", help="URL of an empty database (postgresql://... or sqlite:///...)."),
    ],
) -> None:
    """Copy the whole store into an empty database, migrated first, while no work runs:
    how an installation moves from SQLite to PostgreSQL (then set database.url to it)."""
    from aiworker.core.maintenance.database import copy_database
    from aiworker.runtime.interrupts import signals_raise

    inv: Invocation = ctx.obj
    with signals_raise():  # stopped, its one transaction on the target is rolled back
        report = copy_database(inv.environment(), to).to_json()
    total = sum(report["rows"].values())
    line = f"copied {total} rows of {len(report['rows'])} tables to {report['target']}"
    emit(inv.json, report, lambda c: c.print(line, markup=False))
