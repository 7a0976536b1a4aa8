"""`aiworker restore`: an installation back from `db backup --with-artifacts`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit


def restore(
    ctx: typer.Context,
    source: Annotated[
        Path, typer.Option("--from", help="The database snapshot `db backup` wrote.")
    ],
    artifacts: Annotated[
        Path | None,
        typer.Option("--artifacts", help="The directory `db backup --with-artifacts` filled."),
    ] = None,
) -> None:
    """Restore into an empty state directory, then check every task that has not ended
    against the forge: it carries on, or it is held (paused with the reason) until
    `aiworker task resume`. Restoring an old snapshot while the original installation
    still runs can make both write to the forge."""
    from aiworker.core.maintenance.restore import restore as run
    from aiworker.runtime.interrupts import signals_raise

    inv: Invocation = ctx.obj
    with signals_raise():  # stopped, what it made goes (killed, its marker stays)
        report = run(inv.environment(), source.absolute(), artifacts).to_json()
    kept = report["artifacts"]
    lines = [
        f"restored {report['restored_from']} into {report['state_dir']} "
        f"(schema {report['revision']}, migrated to this version's)",
        f"artifacts: {kept['payloads']} payloads ({kept['bytes']} bytes); "
        f"{len(kept['missing'])} missing, {len(kept['damaged'])} damaged",
    ]
    lines += [f"recovered task {r['task']}: {r['reason']}" for r in report["recovered"]]
    lines += [
        f"task {t['task']} ({t['state']}): {t['outcome']}: {t['reason']}" for t in report["tasks"]
    ]
    emit(inv.json, report, lambda c: c.print("\n".join(lines), markup=False))
