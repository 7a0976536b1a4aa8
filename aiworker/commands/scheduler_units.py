"""`aiworker scheduler run-slot | run-step | install`: what the systemd units run, and
writing those units."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aiworker.invocation import ID_MAX, Invocation
from aiworker.render import emit


def run_slot(
    ctx: typer.Context,
    slot: Annotated[int, typer.Argument(min=1, max=3, help="Slot number.")],
) -> None:
    """Used by aiworker-slot@N.service: take slot-N.lock and run the task claimed on it."""
    from aiworker.core.scheduling.launcher import run_slot as run

    inv: Invocation = ctx.obj
    run(inv.environment(), slot)


def run_step(
    ctx: typer.Context,
    task: Annotated[int, typer.Argument(min=1, max=ID_MAX, help="Task id.")],
) -> None:
    """Used by aiworker-step@TASK.service: take the task's lock and run the step it waits on."""
    from aiworker.core.scheduling.launcher import run_step as run

    inv: Invocation = ctx.obj
    run(inv.environment(), task)


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
    """Write the systemd units with this installation's paths and say what to run next."""
    from aiworker.config.loader import identities_of
    from aiworker.core.guests.backends import provider_homes, written_places
    from aiworker.core.scheduling.units import install_units, next_steps, user_unit_dir
    from aiworker.errors import InvalidInput
    from aiworker.store.engine import sqlite_path

    inv: Invocation = ctx.obj
    if user == (directory is not None):
        raise InvalidInput("choose one of --user (systemd user units) and --dir DIR")
    target = (directory or user_unit_dir()).absolute()
    env = inv.environment()
    if env.state_dir.exists():  # another user's refused before anything is made in it
        env.ensure_state_dir()
    config, interval = inv.config_path.absolute(), env.loaded.config.check_interval
    state_dir = env.state_dir.absolute()
    homes, places = provider_homes(env), written_places(env)
    written = install_units(
        target, config, state_dir, interval, homes, web, runner_server, places=places
    )
    from_env = [
        (name, identity.token_env)
        for name, identity in identities_of(env.loaded.config)
        if identity.token_env and not name.startswith("runner-")
    ]
    database = sqlite_path(env.database_url)
    made = database is None or database.exists()  # a server's: its own to make
    at_home = target == user_unit_dir().absolute()
    report = next_steps(config, state_dir, written, at_home, from_env, database_made=made)
    lines = [*(f"wrote {p}" for p in report.written), "then run:"]
    lines += [f"  {step}" for step in report.next_steps] + [f"note: {n}" for n in report.notes]
    emit(inv.json, report.to_json(), lambda console: console.print("\n".join(lines), markup=False))
