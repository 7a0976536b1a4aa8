"""`aiworker scheduler`: the timer's entry point, pause and resume, status, unit files."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit

app = typer.Typer(
    help="Run, pause and inspect the scheduler.", no_args_is_help=True, rich_markup_mode=None
)


@app.command("tick")
def tick(
    ctx: typer.Context,
    if_due: Annotated[
        bool,
        typer.Option(
            "--if-due",
            help="Check only when check_interval has passed or a check was asked for "
            "(the timer's wake-ups).",
        ),
    ] = False,
) -> int:
    """Poll, recover stale claims, start each free slot's next phase, record a check."""
    from aiworker.core.scheduling.wakeup import not_due

    inv: Invocation = ctx.obj
    waiting = not_due(inv.state_dir, inv.config_path, inv.config_required) if if_due else None
    if waiting is None:
        from aiworker.core.scheduling.tick import tick as run_tick

        waiting = run_tick(inv.environment())
    report = waiting.to_json()

    def human(console: Any) -> None:
        if report["status"] == "not_due":
            console.print("no check due yet", markup=False)
        if report["status"] == "paused":
            console.print("scheduler is paused; nothing started", markup=False)
        for item in report["started"]:
            console.print(f"slot {item['slot']}: started task {item['task']}", markup=False)
        for item in report["delivering"]:
            console.print(f"task {item['task']}: started {item['phase']}", markup=False)
        for kind, reason in report["skipped"].items():
            console.print(f"{kind} tasks wait: {reason}", markup=False)
        if report["poll_error"]:
            console.print(f"poll failed: {report['poll_error']}", markup=False)
        if report["low_space"]:
            console.print(f"nothing new started: {report['low_space']}", markup=False)
        for item in report["stuck"]:
            console.print(f"task {item['task']}: {item['reason']}", markup=False)
        for item in report["expired"]:
            console.print(f"task {item['task']}: failed, {item['reason']}", markup=False)
        console.print(f"next check by {report['next_deadline']}", markup=False)

    emit(inv.json, report, human)
    return waiting.exit_code


@app.command("pause")
def pause(
    ctx: typer.Context,
    reason: Annotated[str, typer.Option("--reason", help="Shown in status.")] = "",
) -> None:
    """Stop starting new work (running jobs finish)."""
    from aiworker.core.scheduler_state import login
    from aiworker.core.scheduler_state import pause as pause_scheduler

    inv: Invocation = ctx.obj
    paused = pause_scheduler(inv.environment(), reason, f"{login()} (command line)")
    emit(inv.json, paused.to_json(), lambda c: c.print(paused.said(), markup=False))


@app.command("resume")
def resume(ctx: typer.Context) -> None:
    """Start new work again."""
    from aiworker.core.scheduler_state import resume as resume_scheduler

    inv: Invocation = ctx.obj
    resume_scheduler(inv.environment())
    emit(inv.json, {"paused": False}, lambda c: c.print("scheduler resumed", markup=False))


@app.command("start-now")
def start_now(ctx: typer.Context) -> None:
    """Request an immediate check through the mechanism the timer and jobs use."""
    from aiworker.core.scheduling.launcher import request_follow_up

    inv: Invocation = ctx.obj
    result = request_follow_up(inv.environment()).to_json()
    line = f"check requested via {result['via']}"
    if result["paused"]:
        line += f"; the scheduler is paused: {result['paused']}; no work starts until resumed"
    emit(inv.json, result, lambda c: c.print(line, markup=False))


@app.command("status")
def status(ctx: typer.Context) -> None:
    """Slots and their holders, pause state, the last and the next check."""
    from aiworker.core.scheduling.status import scheduler_status

    inv: Invocation = ctx.obj
    report = scheduler_status(inv.environment()).to_json()

    def human(console: Any) -> None:
        paused = f"paused ({report['paused_reason']})" if report["paused"] else "running"
        console.print(
            f"scheduler {paused}; last check {report['last_check'] or 'never'}; "
            f"next by {report['next_deadline'] or '-'}",
            markup=False,
        )
        if report["poll_error"]:
            console.print(
                f"poll failing ({report['poll_failures']} in a row): {report['poll_error']}",
                markup=False,
            )
        for slot in report["slots"]:
            holder = slot["holder_pid"] or "-"
            console.print(
                f"slot {slot['slot']}: {'busy' if slot['busy'] else 'free'} "
                f"holder {holder} task {slot['task_id'] or '-'}",
                markup=False,
            )

    emit(inv.json, report, human)


def _register() -> None:
    from aiworker.commands import scheduler_units

    app.command("run-slot")(scheduler_units.run_slot)
    app.command("run-step")(scheduler_units.run_step)
    app.command("install")(scheduler_units.install)


_register()
