"""One bounded execution attempt: validate, materialize, run ./ci/run, reduce, remove.

Describing the job (parse_request, resolve_*) and executing it are separate
steps; the fleet path (runner/agent.py) runs a remote snapshot through run_attempt.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiworker.contracts.native_job import (
    RESULT_CONTRACT,
    ArtifactRef,
    JobRequest,
    Materialization,
)
from aiworker.core.runner.requests import RequestRejected, resolve_entrypoint, resolve_source
from aiworker.runtime.attempts import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_FILES,
    SourceTooLarge,
    copy_tree,
    create_attempt,
    remove_attempt,
    sweep_stale_attempts,
)
from aiworker.runtime.evidence import DEFAULT_TAIL_BYTES
from aiworker.runtime.execution import Limits, Outcome, run_job
from aiworker.secrets import registered

log = logging.getLogger(__name__)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class RunnerSettings:
    source_root: Path
    attempt_root: Path
    kill_grace_s: float = 10.0
    drain_timeout_s: float = 10.0
    tail_bytes: int = DEFAULT_TAIL_BYTES
    # Each stream's first LOG_BYTES bytes are kept and handed to `keep` (the fleet and
    # embedded runners send them to the artifact store); 0 keeps only the tails.
    log_bytes: int = 0
    max_files: int = DEFAULT_MAX_FILES
    max_bytes: int = DEFAULT_MAX_BYTES
    # Runs the command in a disposable guest (GuestChecks) or in bubblewrap hiding the
    # host's secrets (SandboxedChecks) instead of plainly on this host.
    place: Any = None


def job_environment(
    request: JobRequest, attempt_id: str, workspace: Path, home: Path
) -> dict[str, str]:
    """The child's whole environment: nothing is inherited but PATH."""
    env = {
        "PATH": os.environ.get("PATH", DEFAULT_PATH),
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "CI": "true",
    }
    env.update(request["command"]["environment"])
    env.update(
        {
            "AIWORKER_ATTEMPT_ID": attempt_id,
            "AIWORKER_WORKSPACE": str(workspace),
            "AIWORKER_SUITE_ID": request["suite_id"],
        }
    )
    return env


def execute_request(
    request: JobRequest,
    settings: RunnerSettings,
    on_event: Callable[[str, Mapping[str, Any]], None] | None = None,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Run REQUEST, whose source is a local directory inside the source root (checked,
    with its entry point, before anything is copied)."""
    source = resolve_source(request, settings.source_root)
    resolve_entrypoint(source, request["command"]["working_directory"])

    def fill(workspace: Path, _scratch: Path) -> Materialization:
        started = time.monotonic()
        try:
            counts = copy_tree(source, workspace, settings.max_files, settings.max_bytes)
        except SourceTooLarge as exc:
            raise RequestRejected("source_too_large", str(exc), "source.path") from None
        return Materialization(
            files=counts.files,
            directories=counts.directories,
            symlinks=counts.symlinks,
            skipped_special=counts.skipped_special,
            bytes=counts.bytes,
            duration_ms=int((time.monotonic() - started) * 1000),
        )

    return run_attempt(request, settings, fill, on_event, cancel)


Fill = Callable[[Path, Path], Materialization]
# Sends the kept logs ((name, path) pairs) somewhere that outlives the attempt; returns
# what was sent, named in the result.
Keep = Callable[[list[tuple[str, Path]]], list[ArtifactRef]]
DEFAULT_LOG_BYTES = 8 * 1024 * 1024


def run_attempt(
    request: JobRequest,
    settings: RunnerSettings,
    fill: Fill,
    on_event: Callable[[str, Mapping[str, Any]], None] | None = None,
    cancel: threading.Event | None = None,
    keep: Keep | None = None,
) -> dict[str, Any]:
    """One attempt: a fresh private directory, its workspace filled by FILL(workspace,
    scratch), the entry point checked there, ./ci/run run, its logs handed to KEEP, and
    the directory removed. The result is an ait.runner.native-result.v1 document."""
    stale = sweep_stale_attempts(settings.attempt_root)
    if stale:
        log.info("removed %d attempt directories left by dead runners", stale)
    attempt = create_attempt(settings.attempt_root)
    kept: list[ArtifactRef] = []
    try:
        materialization = fill(attempt.workspace, attempt.path / "scratch")
        command = request["command"]
        workdir, entry = resolve_entrypoint(attempt.workspace, command["working_directory"])
        home = attempt.path / "home"
        (home / "tmp").mkdir(mode=0o700, parents=True)
        logs = attempt.path / "logs" if keep is not None and settings.log_bytes else None
        if logs is not None:
            logs.mkdir(mode=0o700)
        env = job_environment(request, attempt.attempt_id, attempt.workspace, home)
        # The request's secrets, and this process's own (a runner's token, which a job
        # run as root can read from its environment; the controller's, embedded).
        secrets = [command["environment"][n].encode() for n in command["secret_environment"]]
        secrets += [value.encode() for value in registered()]
        argv = [str(workdir / entry), *command["argv"][1:]]
        log.info("attempt %s: running %s in %s", attempt.attempt_id, entry, workdir)
        limits = Limits(
            timeout_s=request["timeout_ms"] / 1000,
            kill_grace_s=settings.kill_grace_s,
            drain_timeout_s=settings.drain_timeout_s,
            tail_bytes=settings.tail_bytes,
            log_dir=logs,
            log_bytes=settings.log_bytes if logs is not None else 0,
        )
        run = settings.place.run if settings.place is not None else _on_host
        outcome = run(
            attempt.workspace,
            home,
            argv,
            cwd=workdir,
            env=env,
            limits=limits,
            tag=f"AIWORKER_ATTEMPT_ID={attempt.attempt_id}",
            secrets=secrets,
            on_event=on_event or (lambda _kind, _data: None),
            cancel=cancel,
        )
        if keep is not None:
            # A stream its tail holds whole is in the result already: no log to send.
            streams = (("stdout.log", outcome.stdout), ("stderr.log", outcome.stderr))
            kept = keep([(n, s.log) for n, s in streams if s.log is not None and s.truncated])
    finally:
        removal = remove_attempt(attempt.path)
    cleanup = {
        "removed": removal.removed,
        "attempt_path": str(attempt.path),
        "entries_removed": removal.entries,
        "duration_ms": removal.duration_ms,
        "error": removal.error,
    }
    return build_result(request, attempt.attempt_id, outcome, materialization, cleanup, kept)


def _on_host(_workspace: Path, _home: Path, argv: list[str], **job: Any) -> Outcome:
    return run_job(argv, **job)


def build_result(
    request: JobRequest,
    attempt_id: str,
    outcome: Outcome,
    materialization: Materialization,
    cleanup: dict[str, Any],
    artifacts: list[ArtifactRef] | None = None,
) -> dict[str, Any]:
    """The ait.runner.native-result.v1 document (checked by the controller that gets it,
    contracts/runner.JobResult); without `artifacts` when there are none, so that a
    controller predating the field reads it as before."""
    if outcome.timed_out:
        status = "timed_out"
    elif outcome.exit_code == 0 and outcome.spawn_error is None:
        status = "succeeded"
    else:
        status = "command_failed"
    tests = "pass" if status == "succeeded" else "fail"
    suite = request["suite_id"]
    result: dict[str, Any] = {
        "contract": RESULT_CONTRACT,
        "label": request["label"],
        "suite_id": suite,
        "attempt_id": attempt_id,
        "status": status,
        "tests_status": tests,
        "exit_code": outcome.exit_code,
        "signal": outcome.signal,
        "spawn_error": outcome.spawn_error,
        "started_at": outcome.started_at.isoformat(),
        "finished_at": outcome.finished_at.isoformat(),
        "duration_ms": outcome.duration_ms,
        "suites": [{"suite_id": suite, "status": tests, "duration_ms": outcome.duration_ms}],
        "materialization": dict(materialization),
        "evidence": {
            "stdout": outcome.stdout.as_contract(),
            "stderr": outcome.stderr.as_contract(),
        },
        "termination": {
            "signals_sent": list(outcome.signals_sent),
            "drain_timed_out": outcome.drain_timed_out,
            "leftover_processes_killed": outcome.leftover_processes_killed,
        },
        "cleanup": cleanup,
    }
    if artifacts:
        result["artifacts"] = [dict(ref) for ref in artifacts]
    return result
