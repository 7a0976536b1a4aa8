"""`aiworker sandbox`: the Forgejo-compatible sandbox forge for the demo and the tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit

app = typer.Typer(
    help="Run and seed the sandbox forge (loopback only).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@app.command("serve")
def serve(
    data: Annotated[Path, typer.Option("--data", help="Directory the forge persists to.")],
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="0 picks a free port.")
    ] = 3000,
    host: Annotated[str, typer.Option("--host", help="A loopback address.")] = "127.0.0.1",
) -> None:
    """Serve the sandbox forge's API and git smart HTTP until interrupted."""
    from aiworker.core.maintenance.sandbox import serve_forge

    def announce(url: str) -> None:
        sys.stderr.write(f"sandbox forge at {url}\n")
        if not (data / "state.json").exists():  # a mistyped --data looks like refused tokens
            sys.stderr.write(
                f"note: {data} holds no users or repositories yet; `aiworker sandbox seed "
                f"--data {data}` makes them, and this forge serves them once made\n"
            )
        sys.stderr.flush()

    serve_forge(data, host, port, announce)


@app.command("seed")
def seed(
    ctx: typer.Context,
    data: Annotated[Path, typer.Option("--data", help="Directory the forge persists to.")],
) -> None:
    """Create the demo users, a repository with a small project, and issues."""
    from aiworker.core.maintenance.sandbox import seed_forge

    inv: Invocation = ctx.obj
    result = seed_forge(data).to_json()

    def human(console: Any) -> None:
        for user in result["users"]:
            console.print(f"{user['login']:<14} {user['role']:<18} {user['token']}", markup=False)
        for repo in result["repositories"]:
            console.print(f"repository {repo['full_name']} issues {repo['issues']}", markup=False)

    emit(inv.json, result, human)
