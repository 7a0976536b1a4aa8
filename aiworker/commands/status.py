"""`aiworker status`: tasks by state, slots and the last check."""

from __future__ import annotations

from typing import Any

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit


def status(ctx: typer.Context) -> None:
    """Show task counts by state, slot holders and when work was last checked."""
    from aiworker.core.scheduling.overview import collect_status

    inv: Invocation = ctx.obj
    report = collect_status(inv.environment()).to_json()

    def human(console: Any) -> None:
        from rich.table import Table

        tasks = Table("state", "tasks", title="Tasks")
        for state, count in report["tasks"].items():
            tasks.add_row(state, str(count))
        slots = Table("slot", "busy", "holder pid", "task", "task state", title="Slots")
        for slot in report["slots"]:
            slots.add_row(
                str(slot["slot"]),
                "yes" if slot["busy"] else "no",
                str(slot["holder_pid"] or "-"),
                str(slot["task_id"] or "-"),
                slot["task_state"] or "-",
            )
        console.print(tasks)
        console.print(slots)
        console.print(f"Last check: {report['last_check'] or 'never'}", markup=False)
        for provider, why in report["isolation"].items():
            console.print(f"Provider {provider} cannot run: {why}", markup=False)
        if report["poll_error"]:
            console.print(
                f"Poll failing ({report['poll_failures']} in a row): {report['poll_error']}",
                markup=False,
            )

    emit(inv.json, report, human)
