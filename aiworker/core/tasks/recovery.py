"""Recovery without blind reruns: what a dead job left is closed, explained and counted.

A slot job holds slot-N.lock and a delivery step holds task-N.lock for as long
as it runs, and each attempt records its process id; when the lock is free and
the process is gone, the job is dead. Its open attempts are closed as
`abandoned` with a diagnostic (the last recorded event and the tail of the
task's log), their private homes and workspaces are removed with the reason
recorded, a CI run's `pending` status gets its terminal `error`, and the task
returns to the state it was in before the phase. The abandoned attempt counts
against the budget, so a job that dies every time ends the task as failed.

A fresh claim (not yet started) is never recovered within its grace period,
whoever holds the slot lock: the hand-over from a tick, or from an operator's
`aiworker claim`, to the slot's process must not be mistaken for a death.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.scheduling.launcher import task_log
from aiworker.core.tasks.budgets import RELEASE, land_after_failure
from aiworker.core.tasks.lifecycle import TransitionRefused, advance
from aiworker.core.tasks.states import HOLDS_SLOT, TaskState
from aiworker.runtime.attempts import remove_attempt
from aiworker.runtime.processes import runs_with_arguments
from aiworker.runtime.reaper import signal_all, tagged_processes
from aiworker.secrets import redact
from aiworker.store.attempts import finish_attempt, open_attempts, start_attempt
from aiworker.store.claims import active_claims
from aiworker.store.cleanup import record_cleanup
from aiworker.store.controllers import last_seen, silent_since
from aiworker.store.engine import Database
from aiworker.store.task_records import last_task_event, task_row
from aiworker.store.tasks import append_event

log = logging.getLogger(__name__)
HANDOVER_GRACE = timedelta(seconds=60)
LOG_TAIL_BYTES = 2000
# The state a task returns to when the phase that moved it out of it died.
BEFORE_PHASE = {
    TaskState.CLAIMED: TaskState.READY,
    TaskState.RUNNING: TaskState.READY,
    TaskState.PLANNING: TaskState.READY,
    TaskState.REPAIRING: TaskState.REPAIRING,
}
# A claim no job took up goes back to waiting: a claimed task to ready, a repair episode
# to repairing without a slot.
UNSTARTED = {TaskState.CLAIMED: TaskState.READY, TaskState.REPAIRING: TaskState.REPAIRING}
# Steps that run without a slot, under the task's own lock, and the state each starts in.
STEP_STARTS = {
    "publish": TaskState.IMPLEMENTED,
    "ci": TaskState.AWAITING_CI,
    "review": TaskState.AWAITING_REVIEW,
    "merge": TaskState.APPROVED,
    "milestones": TaskState.MILESTONES,  # a plan's combined checks
}


@dataclass(frozen=True)
class Recovered:
    task: int
    state: str | None  # where it landed; None when it had moved on meanwhile
    reason: str


def diagnostic(env: Environment, db: Database, task_id: int) -> str:
    """What was last recorded for the task, and the tail of its log (secrets masked)."""
    with db.read() as session:
        event = last_task_event(session, task_id)
    last = "nothing" if event is None else f"{event.kind} at {event.created_at.isoformat()}"
    path = task_log(env, task_id)
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
            tail = handle.read().decode(errors="replace").strip()
    except OSError:
        tail = ""
    text = f"last recorded: {last}" + (f"; log tail: {tail[-LOG_TAIL_BYTES:]}" if tail else "")
    return redact(text)


def job_alive(pid: int | None, task_id: int) -> bool:
    """PID still runs a job of TASK_ID (phase commands all take --task ID)."""
    return pid is not None and runs_with_arguments(pid, "--task", str(task_id))


def _abandon(
    env: Environment,
    db: Database,
    task_id: int,
    phases: tuple[str, ...] | None,
    phase: str,
    silent: str | None = None,
) -> str:
    """Close the task's open attempts (of PHASES) as abandoned and remove what they left.
    A job that died before it recorded an attempt gets one recorded for it (as PHASE),
    so that its death counts against the budget like any other. SILENT: the job ran on
    another controller, silent past its lease (says since when); what it left is on that
    host, and nothing here is signalled or removed."""
    died = silent or "the job's process died"
    reason = f"{died}: " + diagnostic(env, db, task_id)
    with db.write() as session:
        attempts = [
            (a.id, a.phase, a.workspace_path, dict(a.settings))
            for a in open_attempts(session, task_id)
            if phases is None or a.phase in phases
        ]
        if not attempts:
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
                    data={"attempt": attempt_id, "phase": closed_phase, "reason": reason},
                )
        if silent is None:
            _clear_local(env, db, task_id, closed_phase, attempt_id, workspace)
        if closed and closed_phase == "ci":
            # Only the one that closed it (two controllers may recover it at once).
            _terminal_ci_status(env, db, task_id, str(settings.get("head") or ""), reason)
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


def _terminal_ci_status(
    env: Environment, db: Database, task_id: int, head: str, reason: str
) -> None:
    from aiworker.core.delivery.ci import post_ci_error
    from aiworker.core.delivery.pull import load_delivery
    from aiworker.errors import AiworkerError

    try:
        post_ci_error(env, load_delivery(db, task_id, TaskState.AWAITING_CI), head, reason)
    except AiworkerError as exc:
        with db.write() as session:
            append_event(session, "ci.status_failed", task_id=task_id, data={"reason": exc.message})


def recover_slots(
    env: Environment, db: Database, own_slots: list[int], now: datetime | None = None
) -> list[Recovered]:
    """Recover claims on slots whose job is dead. OWN_SLOTS are locked by the caller and
    not yet used; a claim on them is still given its grace period."""
    now = now or datetime.now(UTC)
    recovered = []
    with db.read_connection() as connection:
        claims = [r for r in active_claims(connection) if r.state in HOLDS_SLOT]
        seen = last_seen(connection) if any(not _ours(db, r.host) for r in claims) else {}
    for row in claims:
        unstarted = row.state in UNSTARTED and launched_pid(row.token) is None
        if _ours(db, row.host):
            if not _dead_here(env, db, row, own_slots, now):
                continue
            silent = None
        else:
            silent = _silent(db, seen, row.host, now, row.claimed_at)
            if silent is None:
                continue  # that controller still renews: its claim is its own business
        if unstarted:
            # A hand claim nobody took up: given back, nothing was spent. (A job the tick
            # started that died before it began counts below, like any other death.)
            recovered.append(_release(db, row, UNSTARTED[TaskState(row.state)], silent))
            continue
        phase = _phase_of(row.state)
        reason = _abandon(env, db, row.id, None, phase, silent)
        state = land_after_failure(
            env,
            db,
            row.id,
            row.state,
            row.version,
            phase,
            reason,
            retry_state=BEFORE_PHASE[TaskState(row.state)],
        )
        recovered.append(Recovered(int(row.id), state, reason))
        log.warning("recovered task %d from slot %d: %s", row.id, row.slot, reason)
    return recovered


def _ours(db: Database, host: str | None) -> bool:
    """A claim or attempt of this controller (None: recorded before hosts were)."""
    return host is None or host == db.host


def _silent(
    db: Database, seen: dict[str, datetime], host: str, now: datetime, since: datetime | None
) -> str | None:
    """Why HOST's claims and attempts are given up (it fell silent for longer than the
    lease), or None while it still renews. SINCE: when the claim or attempt was made, a
    sign of life too."""
    lease = timedelta(seconds=db.lease_s)
    if since is not None and now - since <= lease:
        return None
    since = silent_since(seen, host, lease, now)
    if since is None:
        return None
    when = "never seen" if since.year == 1 else f"silent since {since.isoformat()}"
    return f"controller {host} is gone ({when}; lease {int(db.lease_s)} s)"


def _dead_here(
    env: Environment, db: Database, row: Any, own_slots: list[int], now: datetime
) -> bool:
    """Whether a claim on one of this host's slots belongs to a dead job: its slot lock
    is free, it is past its hand-over grace or was started, and no process of it runs."""
    if row.slot not in own_slots and env.locks.slot(row.slot).is_locked():
        return False
    launched = launched_pid(row.token)
    fresh = row.claimed_at is not None and now - row.claimed_at < HANDOVER_GRACE
    if row.state in UNSTARTED and launched is None and fresh:
        return False
    with db.read() as session:
        pids = [launched, *(a.pid for a in open_attempts(session, row.id))]
    return not any(job_alive(pid, row.id) for pid in pids)


def launched_pid(token: str | None) -> int | None:
    """The pid a tick recorded in the claim when it started the job (launcher.py)."""
    _, sep, pid = (token or "").rpartition("-pid")
    return int(pid) if sep and pid.isdigit() else None


def _phase_of(state: str) -> str:
    return {"planning": "planning", "repairing": "repair"}.get(state, "implementation")


def _release(db: Database, row: Any, to_state: TaskState, silent: str | None) -> Recovered:
    task_id = int(row.id)
    reason = silent or f"slot {row.slot} lock free: holder {row.token} is gone"
    try:
        with db.write() as session:
            advance(
                session,
                task_id,
                row.state,
                row.version,
                to_state,
                reason,
                kind="task.claim_recovered",
                follow_data_changes=True,
                **RELEASE,
            )
    except TransitionRefused:
        return Recovered(task_id, None, reason)
    return Recovered(task_id, to_state, reason)


def recover_attempts(env: Environment, db: Database) -> list[Recovered]:
    """Close every other open attempt whose process died: a delivery step's or a review's,
    or a phase's whose task was paused or cancelled meanwhile (its claim is gone, so slot
    recovery does not see it). A step whose task is still where the step started is
    retried within its budget; one that had already moved its task is only closed."""
    recovered = []
    now = datetime.now(UTC)
    with db.read() as session:
        dead: dict[int, list[str]] = {}
        away: dict[int, str] = {}  # task: why its attempts' controller counts as gone
        seen = last_seen(session.connection())
        for attempt in open_attempts(session):
            if _ours(db, attempt.host):
                if job_alive(attempt.pid, attempt.task_id):
                    continue
            else:
                silent = _silent(db, seen, str(attempt.host), now, attempt.started_at)
                if silent is None:
                    continue
                away[attempt.task_id] = silent
            dead.setdefault(attempt.task_id, []).append(attempt.phase)
        tasks = {task_id: task_row(session, task_id) for task_id in dead}
    for task_id, phases in sorted(dead.items()):
        task = tasks[task_id]
        locked = task_id not in away and env.locks.lock(f"task-{task_id}").is_locked()
        if task is None or locked:
            continue
        if task.state in HOLDS_SLOT and task.claim_slot is not None:
            continue  # its slot's recovery handles it
        reason = _abandon(env, db, task_id, tuple(phases), phases[0], away.get(task_id))
        state = None
        step = phases[0]
        if STEP_STARTS.get(step) == task.state:
            state = land_after_failure(
                env, db, task_id, task.state, task.version, step, reason, retry_state=task.state
            )
        recovered.append(Recovered(task_id, state, reason))
        log.warning("closed the %s attempt of task %d: %s", step, task_id, reason)
    return recovered
