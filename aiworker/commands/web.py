"""`aiworker web serve`: the loopback web control plane."""

from __future__ import annotations

from typing import Annotated

import typer

from aiworker.invocation import Invocation

app = typer.Typer(no_args_is_help=True, help="The web control plane.")


@app.command("serve")
def serve(
    ctx: typer.Context,
    listen: Annotated[
        str, typer.Option("--listen", help="ADDRESS:PORT to bind (port 0: any free port).")
    ] = "127.0.0.1:8765",
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote",
            help="Allow a non-loopback address (only behind an authenticated HTTPS proxy).",
        ),
    ] = False,
    public_origin: Annotated[
        str | None,
        typer.Option(
            "--public-origin",
            help=(
                "The https://NAME[:PORT] a reverse proxy serves this under (Host and Origin; "
                "default web.public_url)."
            ),
        ),
    ] = None,
    runner_listen: Annotated[
        str | None,
        typer.Option(
            "--runner-listen",
            help="Also serve the runner API (only) on ADDRESS:PORT; it may face other hosts.",
        ),
    ] = None,
) -> None:
    """Serve the operator API and page; prints the addresses it listens on once bound (one
    JSON document with --json: web, runner_api, warning)."""
    from aiworker.web.serve import serve as run

    inv: Invocation = ctx.obj
    run(
        inv.config_path,
        inv.config_required,
        inv.usable_state_dir(),
        listen,
        allow_remote,
        public_origin,
        runner_listen,
        inv.json,
    )
