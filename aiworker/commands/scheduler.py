"""`aiworker scheduler`: the timer's entry point, pause and resume, status, unit files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit

app = typer.Typer(
    help="Run, pause and inspect the scheduler.", no_args_is_help=True, rich_markup_mode=None
)


@app.command("tick")
def tick(ctx: typer.Context) -> None:
    """Poll, recover stale claims, start each free slot's next phase, record a check."""
    from aiworker.core.scheduling.tick import tick as run_tick

    inv: Invocation = ctx.obj
    report = run_tick(inv.environment()).to_json()

    def human(console: Any) -> None:
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
        console.print(f"next check by {report['next_deadline']}", markup=False)

    emit(inv.json, report, human)


@app.command("pause")
def pause(
    ctx: typer.Context,
    reason: Annotated[str, typer.Option("--reason", help="Shown in status.")] = "",
) -> None:
    """Stop starting new work (running jobs finish)."""
    from aiworker.core.scheduling.state import update_state

    inv: Invocation = ctx.obj
    update_state(inv.environment(), paused=True, paused_reason=reason)
    emit(
        inv.json,
        {"paused": True, "reason": reason},
        lambda c: c.print("scheduler paused", markup=False),
    )


@app.command("resume")
def resume(ctx: typer.Context) -> None:
    """Start new work again."""
    from aiworker.core.scheduling.state import update_state

    inv: Invocation = ctx.obj
    update_state(inv.environment(), paused=False, paused_reason="")
    emit(inv.json, {"paused": False}, lambda c: c.print("scheduler resumed", markup=False))


@app.command("start-now")
def start_now(ctx: typer.Context) -> None:
    """Request an immediate check through the mechanism the timer and jobs use."""
    from aiworker.core.scheduling.launcher import request_follow_up

    inv: Invocation = ctx.obj
    result = request_follow_up(inv.environment()).to_json()
    emit(inv.json, result, lambda c: c.print(f"check requested via {result['via']}", markup=False))


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
        for slot in report["slots"]:
            holder = slot["holder_pid"] or "-"
            console.print(
                f"slot {slot['slot']}: {'busy' if slot['busy'] else 'free'} "
                f"holder {holder} task {slot['task_id'] or '-'}",
                markup=False,
            )

    emit(inv.json, report, human)


@app.command("run-slot")
def run_slot(
    ctx: typer.Context,
    slot: Annotated[int, typer.Argument(min=1, max=3, help="Slot number.")],
) -> None:
    """Used by aiworker-slot@N.service: take slot-N.lock and run the task claimed on it."""
    from aiworker.core.scheduling.launcher import run_slot as run

    inv: Invocation = ctx.obj
    run(inv.environment(), slot)


@app.command("install")
def install(
    ctx: typer.Context,
    user: Annotated[bool, typer.Option("--user", help="Install systemd user units.")] = False,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Write the units here instead.")
    ] = None,
    web: Annotated[
        str | None,
        typer.Option("--web", help="Also write aiworker-web.service, serving on ADDRESS:PORT."),
    ] = None,
    runner_server: Annotated[
        str | None, typer.Option(help="Also write aiworker-runner.service for URL.")
    ] = None,
) -> None:
    """Write the systemd units with this installation's paths and say what to enable."""
    from aiworker.core.providers.registry import provider_homes
    from aiworker.core.scheduling.units import NEXT_STEPS, install_units, user_unit_dir
    from aiworker.errors import InvalidInput

    inv: Invocation = ctx.obj
    if not user and directory is None:
        raise InvalidInput("choose --user (systemd user units) or --dir DIR")
    target = directory or user_unit_dir()
    env = inv.environment()
    config, interval = inv.config_path.absolute(), env.loaded.config.check_interval
    homes = provider_homes(env)
    written = install_units(target, config, env.state_dir, interval, homes, web, runner_server)
    result = {"written": [str(p) for p in written], "next_steps": list(NEXT_STEPS)}
    lines = [*(f"wrote {p}" for p in written), "then run:", *(f"  {s}" for s in NEXT_STEPS)]
    emit(inv.json, result, lambda console: console.print("\n".join(lines), markup=False))
