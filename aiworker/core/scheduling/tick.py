"""`aiworker scheduler tick`: the one entry point a timer calls.

It reloads the configuration, honours pause and the maintenance gate, polls,
recovers stale claims, claims work for each free slot under discovery.lock and
starts that slot's phase as its own process holding slot-N.lock, then records
a check receipt. Two ticks at once never start two jobs for one slot: a slot
is only used by the tick that holds its lock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.scheduling.claims import claim_for_slot, recover_stale_claims
from aiworker.core.scheduling.phase_commands import (
    DELIVERY_PHASE,
    aiworker_argv,
    argv_for,
    phase_command,
    runnable_kinds,
)
from aiworker.core.scheduling.state import SchedulerState
from aiworker.errors import AiworkerError, Unavailable
from aiworker.runtime.locks import FileLock
from aiworker.runtime.processes import exec_keeping, run_command, spawn_detached
from aiworker.store.tasks import append_event, claimed_on, task_kind, tasks_in_states

log = logging.getLogger(__name__)
CHECK_EVENT = "scheduler.check"


@dataclass
class TickReport:
    status: str = "checked"  # checked | paused
    poll: dict[str, Any] | None = None
    poll_error: str | None = None
    recovered: list[int] = field(default_factory=list)
    started: list[dict[str, Any]] = field(default_factory=list)
    busy_slots: list[int] = field(default_factory=list)
    delivering: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    next_deadline: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def update_state(env: Environment, **changes: Any) -> SchedulerState:
    with env.locks.held("scheduler-state", timeout=10):
        state = SchedulerState.load(env.state_dir)
        for key, value in changes.items():
            setattr(state, key, value)
        state.save(env.state_dir)
    return state


def tick(env: Environment, *, poll_forge: bool = True) -> TickReport:
    report = TickReport()
    state = SchedulerState.load(env.state_dir)
    if state.paused:
        report.status = "paused"
        return report
    maintenance = env.locks.lock("maintenance")
    if maintenance.is_locked():
        raise Unavailable("maintenance is in progress; no work is started")
    config = env.loaded.config
    if poll_forge and config.forge is not None and config.repositories:
        _poll(env, report)
    db = env.open_database()
    try:
        own = _free_slots(env, report)
        try:
            report.recovered = recover_stale_claims(env, db, [s for s, _ in own])
            kinds, report.skipped = runnable_kinds(env)
            if report.poll_error is None:
                for slot, lock in own:
                    claim = claim_for_slot(env, db, slot, kinds)
                    if claim is not None:
                        report.started.append(launch(env, db, slot, lock, claim.task_id))
        finally:
            for _, lock in own:
                lock.release()
        if report.poll_error is None:
            report.delivering = start_delivery_steps(env, db)
        now = datetime.now(UTC)
        report.next_deadline = (now + timedelta(seconds=config.check_interval)).isoformat()
        with db.transaction() as connection:
            append_event(connection, CHECK_EVENT, actor="scheduler", data=report.as_dict())
    finally:
        db.dispose()
    update_state(
        env, last_check=now.isoformat(), next_deadline=report.next_deadline, check_requested=False
    )
    return report


def request_follow_up(env: Environment) -> dict[str, Any]:
    """Ask for a check now instead of at the next interval (a job that made progress calls
    this): the same mechanism the timer uses starts the tick."""
    update_state(env, check_requested=True)
    if env.loaded.config.scheduler.launcher == "systemd":
        result = run_command(
            ["systemctl", "--user", "start", "--no-block", "aiworker-scheduler.service"], timeout=30
        )
        if not result.ok:
            raise Unavailable(f"systemctl could not start the scheduler: {result.stderr.strip()}")
        return {"requested": True, "via": "aiworker-scheduler.service"}
    argv = [*aiworker_argv(env), "scheduler", "tick"]
    pid = spawn_detached(argv, log_path=env.state_dir / "logs" / "scheduler.log")
    return {"requested": True, "via": "tick", "pid": pid}


def _poll(env: Environment, report: TickReport) -> None:
    from aiworker.core.forge_access import ForgeAccess
    from aiworker.core.intake.discovery import poll

    try:
        report.poll = poll(env, ForgeAccess(env.loaded)).as_dict()
    except AiworkerError as exc:
        # Authorisation could not be verified: start nothing this time.
        report.poll_error = exc.message


def _free_slots(env: Environment, report: TickReport) -> list[tuple[int, FileLock]]:
    own = []
    for slot in range(1, env.loaded.config.shares + 1):
        lock = env.locks.slot(slot)
        if lock.try_acquire():
            own.append((slot, lock))
        else:
            report.busy_slots.append(slot)
    return own


def run_slot(env: Environment, slot: int) -> None:
    """In aiworker-slot@N.service: take slot-N.lock and become the claimed task's phase."""
    lock = env.locks.slot(slot)
    if not lock.try_acquire():
        raise Unavailable(f"slot {slot} is already running a job")
    db = env.open_database()
    try:
        with db.read_connection() as connection:
            claimed = claimed_on(connection, slot)
        if claimed is None:
            lock.release()
            raise Unavailable(f"nothing is claimed on slot {slot}")
        task_id, kind = claimed
        argv = argv_for(env, kind, task_id, slot)
    finally:
        db.dispose()
    exec_keeping(argv, lock.fileno)


def start_delivery_steps(env: Environment, db: Any) -> list[dict[str, Any]]:
    """Start publish, ci, review or merge for each task waiting on one; a per-task lock,
    handed to the step's process, keeps two ticks from running a task's step twice."""
    with db.read_connection() as connection:
        waiting = tasks_in_states(connection, list(DELIVERY_PHASE))
    started = []
    for task_id, state in waiting:
        lock = env.locks.lock(f"task-{task_id}")
        if not lock.try_acquire():
            continue
        command = phase_command(env, DELIVERY_PHASE[state])
        if command is None:
            lock.release()
            continue
        argv = [*command, "--task", str(task_id)]
        pid = spawn_detached(
            argv, log_path=env.state_dir / "logs" / f"task-{task_id}.log", keep_fds=[lock.fileno]
        )
        lock.hand_over(pid)
        started.append({"task": task_id, "phase": DELIVERY_PHASE[state], "pid": pid})
    return started


def launch(env: Environment, db: Any, slot: int, lock: FileLock, task_id: int) -> dict[str, Any]:
    config = env.loaded.config
    with db.read_connection() as connection:
        kind = task_kind(connection, task_id)
    if kind is None:
        raise LookupError(f"task {task_id} vanished after its claim")
    argv = argv_for(env, kind, task_id, slot)
    if config.scheduler.launcher == "systemd":
        # The unit takes the slot lock itself; the claim's hand-over grace covers the gap.
        result = run_command(
            ["systemctl", "--user", "start", "--no-block", f"aiworker-slot@{slot}.service"],
            timeout=30,
        )
        if not result.ok:
            raise Unavailable(f"systemctl could not start slot {slot}: {result.stderr.strip()}")
        return {"slot": slot, "task": task_id, "unit": f"aiworker-slot@{slot}.service"}
    pid = spawn_detached(
        argv, log_path=env.state_dir / "logs" / f"slot-{slot}.log", keep_fds=[lock.fileno]
    )
    lock.hand_over(pid)
    log.info("slot %d: started %s for task %d as pid %d", slot, argv[:4], task_id, pid)
    return {"slot": slot, "task": task_id, "pid": pid}
