"""Keeping house: `aiworker cleanup` (what finished tasks left on disk) and
`aiworker retention` (the artifact store, task refs and stale transfers)."""

from __future__ import annotations

from typing import Annotated

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit

DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Say what the pass would remove; remove nothing.")
]


def cleanup(ctx: typer.Context) -> None:
    """Remove delivered tasks' workspaces, bundles and logs; keep results, receipts and
    merge evidence; record an inventory. A second run changes nothing."""
    from aiworker.core.maintenance.cleanup import cleanup as run

    inv: Invocation = ctx.obj
    report = run(inv.environment()).to_json()
    lines = [f"removed {item['path']} ({item['bytes']} bytes)" for item in report["removed"]]
    lines += [f"skipped task {item['task']}: {item['reason']}" for item in report["skipped"]]
    emit(
        inv.json, report, lambda c: c.print("\n".join(lines) or "nothing to clean up", markup=False)
    )


def retention(ctx: typer.Context, dry_run: DryRun = False) -> None:
    """Remove the payloads of the artifact store no reference keeps any longer, the git
    refs and evidence files of ended tasks and stale transfers; records stay. Every
    tick does the same once per retention.interval_s."""
    from aiworker.core.maintenance.retention import run_retention

    inv: Invocation = ctx.obj
    report = run_retention(inv.environment(), dry_run=dry_run).to_json()
    verb = "would remove" if dry_run else "removed"
    lines = [f"{verb} artifact {r['sha256']} ({r['bytes']} bytes)" for r in report["removed"]]
    lines += [f"{verb} {r['ref']} of task {r['task']}" for r in report["refs"]]
    lines += [f"{verb} {path}" for path in report["files"]]
    lines.append(f"the store holds {report['payloads']} payloads, {report['bytes']} bytes")
    emit(inv.json, report, lambda c: c.print("\n".join(lines), markup=False))
