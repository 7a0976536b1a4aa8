"""`aiworker runner`: the CI execution plane."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from aiworker.render import emit

app = typer.Typer(
    help="Run CI jobs in bounded, isolated attempts.", no_args_is_help=True, rich_markup_mode=None
)

SCHEMA_NAMES = (
    "request",
    "result",
    "error",
    "delivery",
    "snapshot",
    "agent-result",
    "continuation",
)


@app.command("schema")
def schema(
    name: Annotated[
        str,
        typer.Argument(
            help="request, result, error, delivery, snapshot, agent-result or continuation."
        ),
    ] = "request",
) -> None:
    """Print the JSON Schema of a runner contract."""
    from aiworker.contracts.runner import schema as contract_schema
    from aiworker.errors import InvalidInput

    if name not in SCHEMA_NAMES:
        raise InvalidInput(f"unknown schema {name!r}; choose one of {', '.join(SCHEMA_NAMES)}")
    emit(True, contract_schema(name))


@app.command("execute")
def execute(
    request: Annotated[str, typer.Option("--request", help="Request file, or - for stdin.")] = "-",
    source_root: Annotated[
        Path, typer.Option("--source-root", help="Local sources must lie inside this directory.")
    ] = Path("."),
    attempt_root: Annotated[
        Path | None,
        typer.Option(
            "--attempt-root",
            help="Where attempt directories are made (default: $TMPDIR/aiworker/attempts).",
        ),
    ] = None,
    kill_grace_ms: Annotated[
        int, typer.Option("--kill-grace-ms", min=0, max=600_000, help="SIGTERM to SIGKILL.")
    ] = 10_000,
    drain_timeout_ms: Annotated[
        int,
        typer.Option(
            "--drain-timeout-ms",
            min=0,
            max=600_000,
            help="How long to wait for output after the job exits.",
        ),
    ] = 10_000,
    tail_bytes: Annotated[
        int, typer.Option("--tail-bytes", min=0, max=16 * 1024 * 1024, help="Tail kept per stream.")
    ] = 64 * 1024,
) -> int:
    """Run one job request; print one result JSON (exit 0 only when it succeeded)."""
    from aiworker.core.runner.operation import run_execute

    document, code = run_execute(
        request,
        sys.stdin.buffer,
        source_root=source_root,
        attempt_root=attempt_root,
        kill_grace_ms=kill_grace_ms,
        drain_timeout_ms=drain_timeout_ms,
        tail_bytes=tail_bytes,
    )
    emit(True, document)
    return code


def _register() -> None:
    from aiworker.commands import runner_agent

    app.command("serve")(runner_agent.serve)
    app.command("run-job")(runner_agent.run_job)
    app.command("doctor")(runner_agent.doctor)


_register()
