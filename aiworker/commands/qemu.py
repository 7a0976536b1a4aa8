"""`aiworker qemu`: the guest image and the guests phases and checks run in."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit, stages_shown

app = typer.Typer(
    help="Provision the guest image; list, boot, enter and stop guests.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

Cold = Annotated[
    bool, typer.Option("--cold", help="Boot the kernel instead of restoring the saved state.")
]


@app.command("provision")
def provision(
    ctx: typer.Context,
    wait: Annotated[
        float,
        typer.Option("--wait", min=0, help="Seconds to wait for running jobs (else exit 75)."),
    ] = 0,
    recipe: Annotated[
        Path | None, typer.Option("--recipe", help="The image recipe folder (build.sh).")
    ] = None,
    saved_state: Annotated[
        bool,
        typer.Option("--saved-state/--no-saved-state", help="Save a booted state for fast starts."),
    ] = True,
) -> None:
    """Build a new guest image under the maintenance gate; it becomes current only once
    it booted and answered SSH."""
    inv: Invocation = ctx.obj
    from aiworker.core.guests.provision import provision as run
    from aiworker.runtime.interrupts import signals_raise

    env = inv.environment()
    # Stopped (SIGTERM), the build is stopped and what it made removed (then exit 143).
    with signals_raise(), stages_shown(inv.json) as stages:
        built = run(env, wait_s=wait, recipe=recipe, save_state=saved_state, stages=stages)
    report = built.to_json()
    line = (
        f"provisioned {report['image']} ({report['accel']}; built in {report['build_s']} s, "
        f"cold boot {report['cold_boot_s']} s, saved state: {report['saved_state']})"
    )
    emit(inv.json, report, lambda c: c.print(line, markup=False))


@app.command("layer")
def layer(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The layer's NAME (execution.cache_layer).")],
    script: Annotated[
        Path, typer.Option("--script", help="Run as root in the guest; what it writes stays.")
    ],
    wait: Annotated[
        float,
        typer.Option("--wait", min=0, help="Seconds to wait for running jobs (else exit 75)."),
    ] = 0,
) -> None:
    """Build cache layer NAME of the current image (a browser, dependency caches): an
    overlay of the base with what SCRIPT wrote, and its own saved state."""
    from aiworker.core.guests.layers import provision_layer

    inv: Invocation = ctx.obj
    env = inv.environment()
    with stages_shown(inv.json) as stages:
        built = provision_layer(env, name, script, wait_s=wait, stages=stages)
    report = built.to_json()
    line = f"layer {report['layer']} of {report['image']} built in {report['build_s']} s"
    emit(inv.json, report, lambda c: c.print(line, markup=False))


@app.command("list")
def list_guests(ctx: typer.Context) -> None:
    """Images, running guests and their overlays, and who owns each."""
    from aiworker.core.guests.operator import inventory

    inv: Invocation = ctx.obj
    report = inventory(inv.environment()).to_json()

    def human(console: Any) -> None:
        console.print(f"backend: {report['backend']} ({report['backend_reason']})", markup=False)
        for image in report["images"]:
            mark = "*" if image["current"] else " "
            console.print(
                f"{mark} image {image['name']}  {image['accel'] or 'building'}  "
                f"{image['bytes'] // 2**20} MiB  used by {len(image['used_by'])}",
                markup=False,
            )
        for guest in report["guests"]:
            console.print(
                f"  guest {guest['name']}  {guest['purpose']}  pid {guest['pid']}  "
                f"owner {guest['owner']}  port {guest['port']}",
                markup=False,
            )

    emit(inv.json, report, human)


@app.command("boot")
def boot(ctx: typer.Context, cold: Cold = False) -> None:
    """Start a throwaway guest for an operator and print its NAME (it reaches nothing)."""
    from aiworker.core.guests.operator import boot as run

    inv: Invocation = ctx.obj
    report = run(inv.environment(), cold=cold).to_json()
    emit(inv.json, report, lambda c: c.print(report["name"], markup=False))


# After NAME, -h is the guest command's (`df -h`); in NAME's place it is help.
SSH_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command("ssh", context_settings={**SSH_ARGS, "help_option_names": ["--help"]})
def ssh(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The guest's NAME (qemu list).")],
) -> None:
    """A root shell in guest NAME, or `-- CMD...` run there with its exit code."""
    from aiworker.core.guests.operator import ssh as run

    if name == "-h":
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    inv: Invocation = ctx.obj
    raise typer.Exit(run(inv.environment(), name, list(ctx.args)))


@app.command("stop")
def stop(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The guest's NAME (qemu list).")],
) -> None:
    """Power guest NAME off and remove its overlay."""
    from aiworker.core.guests.operator import stop as run

    inv: Invocation = ctx.obj
    report = run(inv.environment(), name).to_json()
    emit(inv.json, report, lambda c: c.print(f"stopped {report['name']}", markup=False))
