"""`aiworker runner serve | run-job | doctor`: a runner on any host, working for the
controller at --server (its token from AIWORKER_SERVER_TOKEN, nothing else from the
environment)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from aiworker.render import emit, emit_health

if TYPE_CHECKING:
    from aiworker.core.runner.agent import AgentOptions

Server = Annotated[str, typer.Option("--server", help="The controller: http(s)://HOST:PORT.")]
WorkerId = Annotated[
    str, typer.Option("--worker-id", help="This runner's name, as the controller records it.")
]
Heartbeat = Annotated[
    int,
    typer.Option("--heartbeat-interval-ms", min=1, help="At most a third of the lease is used."),
]
SourceRoot = Annotated[
    Path, typer.Option("--source-root", help="Local sources must lie inside this directory.")
]
AttemptRoot = Annotated[
    Path | None,
    typer.Option("--attempt-root", help="Attempt directories (default $TMPDIR/aiworker/attempts)."),
]
MaxFiles = Annotated[
    int, typer.Option("--max-files", min=1, max=10_000_000, help="Files in a snapshot.")
]
MaxGib = Annotated[
    int, typer.Option("--max-total-gib", min=1, max=512, help="Bytes of a snapshot, in GiB.")
]
MaxPackGib = Annotated[int, typer.Option("--max-pack-gib", min=1, max=16, help="GiB per pack.")]


def _options(
    worker_id: str, roots: tuple[Path, Path | None], limits: tuple[int, int, int], **more: Any
) -> AgentOptions:
    from aiworker.core.runner.agent import agent_options

    return agent_options(worker_id, roots, limits, **more)


def _show(json_mode: bool, report: dict) -> None:  # type: ignore[type-arg]
    lines = [
        f"worker job {j['repository_index']}/{j['worker_job_index']} attempt {j['attempt']}: "
        f"{j['delivered']}, {j['status']}"
        for j in report["jobs"]
    ]
    text = "\n".join(lines) or f"{report['worker_id']}: no job"
    emit(json_mode, report, lambda c: c.print(text, markup=False))


def serve(
    ctx: typer.Context,
    server: Server,
    worker_id: WorkerId,
    repository_index: Annotated[
        list[int] | None,
        typer.Option("--repository-index", min=1, help="Only these repositories (repeatable)."),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Return after one job's outcome.")] = False,
    poll_interval_ms: Annotated[
        int,
        typer.Option(
            "--poll-interval-ms",
            min=1,
            help="Wait after an empty answer before asking again (long polling off or cut short).",
        ),
    ] = 1000,
    heartbeat_interval_ms: Heartbeat = 30_000,
    long_poll_ms: Annotated[
        int, typer.Option("--long-poll-ms", min=0, max=30_000, help="0: poll instead.")
    ] = 25_000,
    source_root: SourceRoot = Path("."),
    attempt_root: AttemptRoot = None,
    max_files: MaxFiles = 10_000_000,
    max_total_gib: MaxGib = 512,
    max_pack_gib: MaxPackGib = 16,
) -> int:
    """Claim and run jobs until stopped (SIGTERM: finish the running job, then exit)."""
    from aiworker.core.runner.controllers import remote_controller
    from aiworker.core.runner.serve import Signals
    from aiworker.core.runner.serve import serve as run_serve

    options = _options(
        worker_id,
        (source_root, attempt_root),
        (max_files, max_total_gib, max_pack_gib),
        repository_indexes=tuple(sorted(set(repository_index))) if repository_index else None,
        poll_interval_s=poll_interval_ms / 1000,
        heartbeat_interval_s=heartbeat_interval_ms / 1000,
        long_poll_ms=long_poll_ms,
    )
    signals = Signals.installed()
    result = run_serve(remote_controller(server), options, once=once, signals=signals)
    _show(ctx.obj.json, result.to_json())
    return result.exit_code


def run_job(
    ctx: typer.Context,
    server: Server,
    repository_index: Annotated[
        int, typer.Option("--repository-index", min=1, help="The job's repository (its index).")
    ],
    worker_job_index: Annotated[
        int, typer.Option("--worker-job-index", min=1, help="The job's index in that repository.")
    ],
    worker_id: Annotated[
        str, typer.Option("--worker-id", help="This runner's name, as the controller records it.")
    ] = "run-job",
    heartbeat_interval_ms: Heartbeat = 30_000,
    source_root: SourceRoot = Path("."),
    attempt_root: AttemptRoot = None,
    max_files: MaxFiles = 10_000_000,
    max_total_gib: MaxGib = 512,
    max_pack_gib: MaxPackGib = 16,
) -> int:
    """Claim exactly one worker job, run it and deliver its outcome."""
    from aiworker.core.runner.controllers import remote_controller
    from aiworker.core.runner.serve import Signals
    from aiworker.core.runner.serve import run_job as run_pair

    options = _options(
        worker_id,
        (source_root, attempt_root),
        (max_files, max_total_gib, max_pack_gib),
        heartbeat_interval_s=heartbeat_interval_ms / 1000,
    )
    pair = (repository_index, worker_job_index)
    result = run_pair(remote_controller(server), options, pair, Signals.installed())
    _show(ctx.obj.json, result.to_json())
    return result.exit_code


def doctor(ctx: typer.Context, server: Server, attempt_root: AttemptRoot = None) -> int:
    """Check the controller, the token, the contract, the clock and the attempt root."""
    from aiworker.core.runner.controllers import remote_controller
    from aiworker.core.runner.runner_doctor import doctor as check
    from aiworker.runtime.attempts import default_attempt_root

    report = check(remote_controller(server, 2.0), attempt_root or default_attempt_root())
    emit_health(ctx.obj.json, report.to_json())
    return report.exit_code
