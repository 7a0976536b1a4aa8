"""Starting jobs: a slot's phase as its own process holding slot-N.lock, a delivery step
holding task-N.lock, or, under the systemd launcher, each as a unit of its own
(aiworker-slot@N.service, aiworker-step@TASK.service) that outlives the tick.

Every job writes to its task's own log (logs/task-N.log), which cleanup removes
with the task; a unit's job writes to the journal as well. A job started here
carries AIWORKER_FOLLOW_UP=1: when it makes progress it asks for a check right
away instead of at the next interval.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiworker.core.context import JOB_OUTAGE_WAIT_S, Environment, task_log
from aiworker.core.phases.table import PUBLISH, TASK, starting, step_states
from aiworker.core.report import Report
from aiworker.core.scheduler_state import request_check
from aiworker.core.scheduling.phase_commands import aiworker_argv, argv_for, phase_command
from aiworker.core.tasks.claim_jobs import name_job
from aiworker.core.tasks.hosts import published_elsewhere
from aiworker.errors import FULL_ERRNOS, AiworkerError, InvalidInput, Unavailable
from aiworker.logs import STAMP_ENV
from aiworker.runtime.locks import FileLock
from aiworker.runtime.logfiles import Rotation
from aiworker.runtime.processes import (
    exec_keeping,
    run_command,
    spawn_detached,
    still_running,
    tee_output,
)
from aiworker.store.claims import claimed_on
from aiworker.store.engine import Database
from aiworker.store.tasks import kind_and_state, tasks_in_states

log = logging.getLogger(__name__)
T = TypeVar("T")
FOLLOW_UP = "AIWORKER_FOLLOW_UP"
_FOLLOW_UPS: list[int] = []  # the tick this process last started for a follow-up
_FOLLOWING_UP = threading.Lock()


def log_rotation(env: Environment) -> Rotation:
    """How far a log file grows before it is rotated, and how many rotated ones stay."""
    housekeeping = env.loaded.config.housekeeping
    return Rotation(housekeeping.log_max_mib * 1024 * 1024, housekeeping.log_keep)


def _detached(
    env: Environment, argv: list[str], log_path: Path, keep_fds: tuple[int, ...] = ()
) -> int:
    """ARGV started detached, its output appended, stamped line by line, to LOG_PATH; a
    job (it holds a lock, KEEP_FDS) is asked to request a check when it made progress."""
    extra = {STAMP_ENV: "1", **({FOLLOW_UP: "1"} if keep_fds else {})}
    try:
        return spawn_detached(
            argv, log_path=log_path, keep_fds=keep_fds, env=extra, rotation=log_rotation(env)
        )
    except OSError as exc:
        if exc.filename != argv[0] or exc.errno in FULL_ERRNOS:
            raise  # its log, or this host short of processes or memory: said as such
        configured = argv[0] != sys.executable  # the program scheduler.phase_commands names
        raise LaunchFailed(
            f"{argv[0]!r} cannot be started: {exc.strerror}"
            + ("; check scheduler.phase_commands in the configuration" if configured else "")
        ) from None


class LaunchFailed(AiworkerError):
    """The configured launcher cannot start jobs: an installation's fault, which waiting
    does not cure (exit 1, so that the tick's unit fails where it is seen)."""

    code = "launch_failed"


def _systemctl_start(unit: str) -> None:
    result = run_command(["systemctl", "--user", "start", "--no-block", unit], timeout=30)
    if not result.ok:
        raise Unavailable(f"systemctl could not start {unit}: {result.stderr.strip()}")


@dataclass
class FollowUpReport(Report):
    requested: bool
    via: str  # tick | aiworker-scheduler.service
    pid: int | None  # the tick's process, when it was started directly
    paused: str | None = None  # the scheduler is paused, so the check starts nothing: why


def request_follow_up(env: Environment) -> FollowUpReport:
    """Ask for a check now instead of at the next interval: the same mechanism the timer
    uses starts the tick. Requests while a tick this process started for one still runs
    join it: the request stays recorded past that tick's start, so the next tick (the
    timer's) answers it; a hundred clicks started a hundred ticks, 4.6 GiB at once."""
    state = request_check(env)
    why = state.paused_reason or "no reason given"
    paused = f"{why} (by {state.paused_by})" if state.paused else None
    if env.loaded.config.scheduler.launcher == "systemd":
        _systemctl_start("aiworker-scheduler.service")  # systemd starts it once
        return FollowUpReport(True, "aiworker-scheduler.service", None, paused)
    with _FOLLOWING_UP:  # the web plane answers clicks on several threads
        if not (_FOLLOW_UPS and still_running(_FOLLOW_UPS[-1])):
            argv = [*aiworker_argv(env), "scheduler", "tick"]
            _FOLLOW_UPS[:] = [_detached(env, argv, env.state_dir / "logs" / "scheduler.log")]
        return FollowUpReport(True, "tick", _FOLLOW_UPS[-1], paused)


def follow_up_if_asked(env: Environment) -> None:
    """A job the scheduler started made progress: check again now (best effort)."""
    if os.environ.get(FOLLOW_UP) == "1" and env.loaded.config.scheduler.follow_up:
        try:
            request_follow_up(env)
        except Unavailable as exc:
            log.warning("follow-up check not requested: %s", exc.message)


def run_slot(env: Environment, slot: int) -> None:
    """In aiworker-slot@N.service: take slot-N.lock and become the claimed task's phase."""
    shares = env.loaded.config.shares
    if slot > shares:  # an instance the configuration does not have: a mistake, not a wait
        raise InvalidInput(f"slot {slot}: this configuration has {shares} (shares = {shares})")
    lock = env.locks.slot(slot)
    if not lock.try_acquire():
        raise Unavailable(f"slot {slot} is already running a job")
    claimed = _read(env, lambda connection: claimed_on(connection, slot, env.controller_id))
    if claimed is None:
        lock.release()
        raise Unavailable(f"nothing is claimed on slot {slot}")
    task_id, kind, state = claimed
    _become_job(env, task_id, argv_for(env, kind, state, task_id, slot), lock)


def run_step(env: Environment, task_id: int) -> None:
    """In aiworker-step@TASK.service: take task-TASK.lock and become the step its state
    waits on (publish, ci, review, merge or the plan step)."""
    lock = env.locks.lock(f"task-{task_id}")
    if not lock.try_acquire():
        raise Unavailable(f"a step of task {task_id} is already running")
    found = _read(env, lambda connection: kind_and_state(connection, task_id))
    step = None if found is None else starting(TASK, *found)
    command = None if step is None else phase_command(env, step.command)
    if command is None:
        lock.release()
        state = "gone" if found is None else found[1]
        raise Unavailable(f"task {task_id} waits on no step (it is {state})")
    _become_job(env, task_id, [*command, "--task", str(task_id)], lock)


def _read(env: Environment, query: Callable[[Any], T]) -> T:
    """QUERY's answer from a database opened for it alone (a unit's job execs next): its
    first look, so it waits for a server that is down as the job would."""
    db = env.open_database(patience=JOB_OUTAGE_WAIT_S)
    try:
        with db.read_connection() as connection:
            return query(connection)
    finally:
        db.dispose()


def _become_job(env: Environment, task_id: int, argv: list[str], lock: FileLock) -> None:
    """Replace this unit's process with the job, holding LOCK, its output appended to the
    task's log and still reaching the journal; stamped line by line like a detached
    job's, so the task's log reads the same under either launcher."""
    log.info("task %d: running %s", task_id, " ".join(argv[-5:]))
    os.environ[FOLLOW_UP] = "1"
    os.environ[STAMP_ENV] = "1"
    tee_output(task_log(env, task_id), log_rotation(env))
    exec_keeping(argv, lock.fileno)


def start_delivery_steps(env: Environment, db: Database) -> list[dict[str, Any]]:
    """Start publish, ci, review or merge for each task waiting on one (and the plan step
    for a plan awaiting approval or running its milestones); a per-task lock,
    handed to the step's process, keeps two ticks from running a task's step twice.
    Under the systemd launcher each step is aiworker-step@TASK.service, which takes the
    lock itself (starting an active unit again is a no-op)."""
    with db.read_connection() as connection:
        waiting = tasks_in_states(connection, step_states())
    unpublished = [t for t, state, _ in waiting if state in PUBLISH.starts]
    elsewhere = published_elsewhere(env, db, unpublished)
    units = env.loaded.config.scheduler.launcher == "systemd"
    started: list[dict[str, Any]] = []
    for task_id, state, kind in waiting:
        step = starting(TASK, kind, state)  # none for a milestone: its plan's step accepts it
        if step is None or task_id in elsewhere:
            continue  # (another controller holds the commits it publishes)
        lock = env.locks.lock(f"task-{task_id}")
        if not lock.try_acquire():
            continue
        command = phase_command(env, step.command)
        if command is None:
            lock.release()
            continue
        entry: dict[str, Any] = {"task": task_id, "phase": step.command}
        if units:
            lock.release()
            entry["unit"] = step_unit(task_id)
            _systemctl_start(entry["unit"])
        else:
            argv = [*command, "--task", str(task_id)]
            try:
                entry["pid"] = _detached(env, argv, task_log(env, task_id), (lock.fileno,))
            except LaunchFailed:
                lock.release()
                raise
            lock.hand_over(entry["pid"])
        started.append(entry)
    return started


def step_unit(task_id: int) -> str:
    return f"aiworker-step@{task_id}.service"


def launch(
    env: Environment, db: Database, slot: int, lock: FileLock, task_id: int
) -> dict[str, Any]:
    with db.read_connection() as connection:
        found = kind_and_state(connection, task_id)
    if found is None:
        raise LookupError(f"task {task_id} vanished after its claim")
    argv = argv_for(env, *found, task_id, slot)
    if env.loaded.config.scheduler.launcher == "systemd":
        # The unit takes the slot lock itself; the claim's hand-over grace covers the gap.
        unit = f"aiworker-slot@{slot}.service"
        try:
            _systemctl_start(unit)
        except Unavailable as exc:
            from aiworker.core.tasks.recovery import give_back

            give_back(db, task_id, f"{exc.message}; the claim was given back")
            raise LaunchFailed(
                f"{exc.message}; the claim of task {task_id} was given back. The units "
                "run in this user's systemd: is it running for the user (loginctl "
                "enable-linger), and are they installed (aiworker scheduler install)?"
            ) from None
        name_job(db, task_id, slot, None, unit)
        return {"slot": slot, "task": task_id, "unit": unit}
    try:
        pid = _detached(env, argv, task_log(env, task_id), (lock.fileno,))
    except LaunchFailed as exc:
        from aiworker.core.tasks.recovery import give_back

        give_back(db, task_id, f"{exc.message}; the claim was given back")
        exc.message += f"; the claim of task {task_id} was given back"
        raise
    lock.hand_over(pid)
    name_job(db, task_id, slot, pid)
    log.info("slot %d: started %s for task %d as pid %d", slot, argv[:4], task_id, pid)
    return {"slot": slot, "task": task_id, "pid": pid}
