"""The phases a slot runs: `aiworker implement` and `aiworker repair` (the delivery steps
follow: commands/delivery.py)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from aiworker.invocation import ID_MAX, Invocation
from aiworker.render import emit

Claimed = Annotated[int, typer.Option("--task", min=1, max=ID_MAX, help="The claimed task.")]
ClaimedPlan = Annotated[
    int, typer.Option("--task", min=1, max=ID_MAX, help="The claimed plan task.")
]
Repairing = Annotated[int, typer.Option("--task", min=1, max=ID_MAX, help="The repairing task.")]
Slot = Annotated[int, typer.Option("--slot", min=1, max=3, help="Its slot.")]


def implement(ctx: typer.Context, task: Claimed, slot: Slot) -> int:
    """Implement a claimed task: pin the base, choose a provider, run it in a disposable
    workspace, import its commits and re-run the required checks (exit 75: no provider now)."""
    inv: Invocation = ctx.obj
    return _attempt_report(inv, run_unit(inv, "implement", task, slot))


def plan(ctx: typer.Context, task: ClaimedPlan, slot: Slot) -> int:
    """Plan a plan-labelled issue: the planner proposes bounded milestones, the host checks
    them and posts the plan on the issue to await approval (exit 75: no provider now)."""
    inv: Invocation = ctx.obj
    return _attempt_report(inv, run_unit(inv, "plan", task, slot))


def repair(ctx: typer.Context, task: Repairing, slot: Slot) -> int:
    """Run one repair episode after requested changes, a red CI or a moved base: a fresh
    session on the task's branch, then the checks again (exit 75: no provider now)."""
    inv: Invocation = ctx.obj
    return _attempt_report(inv, run_unit(inv, "repair", task, slot))


def run_unit(inv: Invocation, command: str, task: int, slot: int | None = None) -> Any:
    """Run the phase or step COMMAND for TASK through the driver; its report. A job the
    scheduler started that made progress asks for a check now."""
    from aiworker.core.phases.engine import run_phase
    from aiworker.core.phases.table import COMMANDS
    from aiworker.core.scheduling.launcher import follow_up_if_asked

    env = inv.environment()
    outcome = run_phase(env, COMMANDS[command], task, slot)
    if outcome.follow_up:
        follow_up_if_asked(env)
    return outcome.report


def _attempt_report(inv: Invocation, result: Any) -> int:
    report = result.to_json()

    def human(console: Any) -> None:
        # No provider was admitted: no attempt was recorded either.
        ran = f" with {report['provider']}" if report["provider"] else ""
        attempt = f" (attempt {report['attempt']})" if report["attempt"] is not None else ""
        console.print(f"task {report['task']}: {report['outcome']}{ran}{attempt}", markup=False)
        if report["reason"]:
            console.print(f"reason: {report['reason']}", markup=False)
        if report["gate"]:
            for check in report["gate"]["checks"]:
                state = "pass" if check["passed"] else "FAIL"
                console.print(f"  {check['check_id']}: {state} at {report['head']}", markup=False)
            for finding in report["gate"]["findings"]:
                console.print(f"  finding: {finding}", markup=False)

    emit(inv.json, report, human)
    return int(result.exit_code)
