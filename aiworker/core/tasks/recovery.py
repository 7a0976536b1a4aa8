"""Recovery without blind reruns: what a dead job left is closed, explained and counted.

A slot job holds slot-N.lock and a delivery step holds task-N.lock for as long
as it runs, and each attempt records its process id; when the lock is free and
the process is gone, the job is dead. Its open attempts are closed as
`abandoned` with a diagnostic (the last recorded event; the tail of the task's
log goes with their event), their private homes and workspaces are removed with the reason
recorded, a CI run's `pending` status gets its terminal `error`, and the task
returns to the state it was in before the phase. The abandoned attempt counts
against the budget, so a job that dies every time ends the task as failed.

A fresh claim (not yet started) is never recovered within its grace period,
whoever holds the slot lock: the hand-over from a tick, or from an operator's
`aiworker claim`, to the slot's process must not be mistaken for a death.

Closing what the job left is abandon.py's part; telling this controller's work from
another's, and whether that one still renews, hosts.py's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.phases.table import NAMES, PHASES, SLOT, TASK, held_by
from aiworker.core.tasks.abandon import abandon
from aiworker.core.tasks.budgets import RELEASE, land_after_failure
from aiworker.core.tasks.claim_jobs import started_as_unit
from aiworker.core.tasks.hosts import gone, ours
from aiworker.core.tasks.lifecycle import Refusal, try_advance
from aiworker.core.tasks.signs_of_life import watched
from aiworker.core.tasks.states import HOLDS_SLOT, TaskState
from aiworker.runtime.processes import run_command, runs_with_arguments
from aiworker.store.attempts import open_attempts
from aiworker.store.claims import active_claims
from aiworker.store.controllers import last_seen, server_now
from aiworker.store.engine import Database
from aiworker.store.task_records import task_row

log = logging.getLogger(__name__)
HANDOVER_GRACE = timedelta(seconds=60)
# A claim no job took up (a state some slot phase starts from) goes back to waiting, where
# its phase retries: a claimed task to ready, a repair episode to repairing without a slot.
UNSTARTED = frozenset(state for p in PHASES if p.lock == SLOT for state in p.starts)


@dataclass(frozen=True)
class Recovered:
    task: int
    state: str | None  # where it landed; None when it had moved on meanwhile
    reason: str


def job_alive(pid: int | None, task_id: int) -> bool:
    """PID still runs a job of TASK_ID (phase commands all take --task ID)."""
    return pid is not None and runs_with_arguments(pid, "--task", str(task_id))


def recover_slots(
    env: Environment, db: Database, own_slots: list[int], now: datetime | None = None
) -> list[Recovered]:
    """Recover claims on slots whose job is dead. OWN_SLOTS are locked by the caller and
    not yet used; a claim on them is still given its grace period."""
    now = now or datetime.now(UTC)
    recovered = []
    with db.read_connection() as connection:
        claims = [r for r in active_claims(connection) if r.state in HOLDS_SLOT]
        others = any(not ours(db, r.host) for r in claims)
        seen = watched(env.state_dir, last_seen(connection, judged=True)) if others else {}
        judged = server_now(connection) if others else now  # as signs of life are written
    for row in claims:
        # A job the tick started (as a process or a unit) that died before it began
        # counts like any other death: a unit that cannot start is not restarted for ever.
        started = launched_pid(row.token) is not None or started_as_unit(row.token)
        unstarted = row.state in UNSTARTED and not started
        # The phase whose claim it is; a task goes back where that phase retries.
        phase = held_by(row.state, row.kind)
        if ours(db, row.host):
            if not _dead_here(env, db, row, own_slots, now):
                continue
            silent = None
        else:
            silent = gone(db, seen, row.host, judged, row.claimed_at)
            if silent is None:
                continue  # that controller still renews: its claim is its own business
        if unstarted:
            # A hand claim nobody took up: given back, nothing was spent.
            recovered.append(_release(db, row, TaskState(phase.retry or row.state), silent))
            continue
        reason = abandon(env, db, row.id, None, phase.name, silent, row.claimed_at)
        state = land_after_failure(
            env,
            db,
            row.id,
            row.state,
            row.version,
            phase.name,
            reason,
            retry_state=phase.retry or row.state,
        )
        recovered.append(Recovered(int(row.id), state, reason))
        log.warning("recovered task %d from slot %d: %s", row.id, row.slot, reason)
    return recovered


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
        return False  # a claim by hand, or a unit still starting
    if row.state in UNSTARTED and started_as_unit(row.token) and _unit_starting(row.slot):
        return False  # systemd still starts it: a starved host may take minutes
    with db.read() as session:
        pids = [launched, *(a.pid for a in open_attempts(session, row.id))]
    return not any(job_alive(pid, row.id) for pid in pids)


def _unit_starting(slot: int) -> bool:
    """Whether systemd still starts (or runs) the slot's unit: its job has not taken the
    slot up yet, and is no dead job's (systemd's own start timeout ends a stuck one)."""
    unit = f"aiworker-slot@{slot}.service"
    state = run_command(["systemctl", "--user", "is-active", unit], timeout=10).stdout
    return state.strip() in ("activating", "active", "reloading")


def launched_pid(token: str | None) -> int | None:
    """The pid a tick recorded in the claim when it started the job (launcher.py)."""
    _, sep, pid = (token or "").rpartition("-pid")
    return int(pid) if sep and pid.isdigit() else None


def _release(db: Database, row: Any, to_state: TaskState, silent: str | None) -> Recovered:
    task_id = int(row.id)
    reason = silent or f"slot {row.slot} lock free: holder {row.token} is gone"
    with db.write() as session:
        moved = try_advance(
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
    return Recovered(task_id, None if isinstance(moved, Refusal) else to_state, reason)


def give_back(db: Database, task_id: int, reason: str) -> None:
    """The claim of TASK_ID whose job could not be started at all: back to where its
    phase waits, nothing spent (the launcher's failure, not the task's)."""
    with db.read_connection() as connection:
        row = next((r for r in active_claims(connection) if r.id == task_id), None)
    if row is not None:
        phase = held_by(row.state, row.kind)
        _release(db, row, TaskState(phase.retry or row.state), reason)


def recover_attempts(env: Environment, db: Database) -> list[Recovered]:
    """Close every other open attempt whose process died: a delivery step's or a review's,
    or a phase's whose task was paused or cancelled meanwhile (its claim is gone, so slot
    recovery does not see it). A step whose task is still where the step started is
    retried within its budget; one that had already moved its task is only closed."""
    recovered = []
    with db.read() as session:
        dead: dict[int, list[str]] = {}
        away: dict[int, str] = {}  # task: why its attempts' controller counts as gone
        seen = watched(env.state_dir, last_seen(session.connection(), judged=True))
        now = server_now(session.connection())  # the clock signs of life are written by
        for attempt in open_attempts(session):
            if ours(db, attempt.host):
                if job_alive(attempt.pid, attempt.task_id):
                    continue
            else:
                silent = gone(db, seen, str(attempt.host), now, attempt.started_at)
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
        reason = abandon(env, db, task_id, tuple(phases), phases[0], away.get(task_id))
        state = None
        step = phases[0]
        unit = NAMES.get(step)
        if unit is not None and unit.lock == TASK and task.state in unit.starts:
            state = land_after_failure(
                env, db, task_id, task.state, task.version, step, reason, retry_state=task.state
            )
        recovered.append(Recovered(task_id, state, reason))
        log.warning("closed the %s attempt of task %d: %s", step, task_id, reason)
    return recovered


def recover_task(env: Environment, db: Database, task_id: int) -> None:
    """Close the task's attempts on this controller whose process died, for a step that
    holds task-N.lock (run by hand after its last run was killed, say): nothing of the
    task runs here meanwhile, and they are closed before the step is charged, so a spent
    budget's comment names them abandoned rather than open."""
    with db.read() as session:
        dead = {
            a.phase
            for a in open_attempts(session, task_id)
            if ours(db, a.host) and not job_alive(a.pid, task_id)
        }
    if dead:
        phases = tuple(sorted(dead))
        reason = abandon(env, db, task_id, phases, phases[0], None)
        log.warning("closed the %s attempt of task %d: %s", phases[0], task_id, reason)
