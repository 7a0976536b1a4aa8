"""Closing what a dead job left: its open attempts end `abandoned` with a diagnostic (the
last recorded event; the tail of the task's log goes with the event, for operators),
what it left running on this host is killed and its workspace removed with the reason
recorded, and a CI run's `pending` status gets its terminal `error`. Deciding which
job is dead is recovery.py's part."""

from __future__ import annotations

import signal
from datetime import datetime
from pathlib import Path

from aiworker.core.context import Environment, task_log
from aiworker.core.phases.table import NAMES, load
from aiworker.runtime.attempts import remove_attempt
from aiworker.runtime.reaper import signal_all, tagged_processes
from aiworker.secrets import redact
from aiworker.store.attempts import (
    attempted_since,
    finish_attempt,
    open_attempts,
    start_attempt,
)
from aiworker.store.cleanup import record_cleanup
from aiworker.store.engine import Database
from aiworker.store.task_records import last_task_event
from aiworker.store.tasks import append_event
from aiworker.store.worker_job_records import end_awaited_by

LOG_TAIL_BYTES = 2000
SECRET_MARGIN = 8192  # longer than any token the redactor masks


def diagnostic(env: Environment, db: Database, task_id: int) -> tuple[str, str]:
    """What was last recorded for the task, and the tail of its log (secrets masked). The
    first is the attempt's reason, which issue comments quote; the tail (tracebacks,
    paths on this host) is the operator's, in the event alone."""
    with db.read() as session:
        event = last_task_event(session, task_id)
    last = "nothing" if event is None else f"{event.kind} at {event.created_at.isoformat()}"
    path = task_log(env, task_id)
    try:
        with path.open("rb") as handle:
            # A margin more, masked before the cut: a secret across the cut is masked too.
            handle.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES - SECRET_MARGIN))
            tail = redact(handle.read().decode(errors="replace").strip())
    except OSError:
        tail = ""
    return f"last recorded: {last}", tail[-LOG_TAIL_BYTES:]


def abandon(
    env: Environment,
    db: Database,
    task_id: int,
    phases: tuple[str, ...] | None,
    phase: str,
    silent: str | None = None,
    since: datetime | None = None,
) -> str:
    """Close the task's open attempts (of PHASES) as abandoned and remove what they left.
    A job that died before it recorded an attempt gets one recorded for it (as PHASE),
    so that its death counts against the budget like any other; not when an attempt
    started at or after SINCE (the claim's time) is already recorded: a second
    controller recovering the same claim at the same time charges nothing again. SILENT:
    the job ran on another controller, silent past its lease (says since when); what it
    left is on that host, and nothing here is signalled or removed."""
    died = silent or "the job's process died"
    last, tail = diagnostic(env, db, task_id)
    reason = f"{died}: {last}"
    with db.write() as session:
        attempts = [
            (a.id, a.phase, a.workspace_path, dict(a.settings))
            for a in open_attempts(session, task_id)
            if phases is None or a.phase in phases
        ]
        if not attempts and not (since and attempted_since(session, task_id, since)):
            attempts = [
                (start_attempt(session, task_id, phase, None, None, None, {}), phase, None, {})
            ]
    for attempt_id, closed_phase, workspace, settings in attempts:
        with db.write() as session:
            closed = finish_attempt(session, attempt_id, "abandoned", reason=reason)
            if closed:
                append_event(
                    session,
                    "attempt.abandoned",
                    task_id=task_id,
                    data={
                        "attempt": attempt_id,
                        "phase": closed_phase,
                        "reason": reason,
                        "log_tail": tail,
                    },
                )
        # The checks and CI it queued for runners: nobody will read their delivery.
        end_awaited_by(db, attempt_id, {"error": f"the attempt awaiting it was abandoned: {died}"})
        if silent is None:
            _clear_local(env, db, task_id, closed_phase, attempt_id, workspace)
        hook = NAMES[closed_phase].abandoned if closed_phase in NAMES else ""
        if closed and hook:
            # Only the one that closed it (two controllers may recover it at once): a CI
            # run's pending status gets its terminal error.
            head = str(settings.get("head") or "")
            load(hook)(env, db, task_id, head, reason)
    return reason


def _clear_local(
    env: Environment,
    db: Database,
    task_id: int,
    closed_phase: str,
    attempt_id: int,
    workspace: str | None,
) -> None:
    """Kill what a dead job on this host left running, and remove its workspace."""
    # The provider's processes outlive a killed phase; they carry the attempt's tag.
    signal_all(
        tagged_processes(
            f"AIWORKER_ATTEMPT_ID={env.attempt_tag(closed_phase, attempt_id)}".encode()
        ),
        signal.SIGKILL,
    )
    if workspace:
        _remove_workspace(db, task_id, Path(workspace))


def _remove_workspace(db: Database, task_id: int, root: Path) -> None:
    if not root.exists():
        return
    removed = remove_attempt(root).removed
    with db.write() as session:
        record_cleanup(
            session,
            task_id,
            str(root),
            "removed" if removed else "kept",
            "an abandoned attempt's workspace and private home"
            if removed
            else "could not be removed",
            None,
        )
