"""`aiworker poll` and `aiworker claim`: discover authorised work and claim it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit

Full = Annotated[
    bool, typer.Option("--full", help="Re-read every candidate now, not only changes.")
]


def poll(ctx: typer.Context, full: Full = False) -> None:
    """Record labelled and assigned issues as tasks, verifying who authorised each; between
    full polls (hourly, or --full) only the issues updated since the last poll are read."""
    from aiworker.core.scheduling.tick import poll_recorded

    inv: Invocation = ctx.obj
    report = poll_recorded(inv.environment(), full=full).to_json()

    def human(console: Any) -> None:
        tasks = ", ".join(f"{k} {v}" for k, v in sorted(report["tasks"].items())) or "none"
        polls = ", ".join(f"{v} {k}" for k, v in sorted(report["polls"].items()))
        console.print(
            f"polled {report['repositories']} repositories ({polls}); tasks: {tasks}",
            markup=False,
        )
        for item in report["unauthorized"]:
            console.print(
                f"not authorised: {item['repository']}#{item['issue']}: {item['reason']}",
                markup=False,
            )
        for item in report["paused"]:
            console.print(
                f"paused: {item['repository']}#{item['issue']} (task {item['task']})", markup=False
            )

    emit(inv.json, report, human)


def claim(
    ctx: typer.Context,
    slot: Annotated[
        int | None, typer.Option("--slot", min=1, max=3, help="Slot to claim for.")
    ] = None,
) -> int:
    """Claim the next eligible task for a free slot (exit 75 when none is free).

    Outside a scheduler tick nothing holds the slot afterwards, so the next tick
    releases such a claim as stale after a minute unless a process takes slot-N.lock.
    """
    from aiworker.core.scheduling.claims import claim_once

    inv: Invocation = ctx.obj
    claimed = claim_once(inv.environment(), slot)
    result = claimed.to_json()

    def human(console: Any) -> None:
        if result["claimed"]:
            console.print(f"slot {result['slot']}: claimed task {result['task']}", markup=False)
        else:
            console.print(f"nothing claimed: {result['reason']}", markup=False)

    emit(inv.json, result, human)
    return claimed.exit_code
