"""`aiworker scheduler tick`: the one entry point a timer calls.

It reloads the configuration, honours pause, the maintenance gate and the free-space
reserve (core/maintenance/storage.py), polls,
recovers what dead jobs left (tasks/recovery.py), ends idle tasks past their deadline
(tasks/deadlines.py), claims work for each free
slot under discovery.lock and starts that slot's phase as its own process
holding slot-N.lock, starts waiting delivery steps, keeps house (cleanup after
delivery and retention, the latest N check receipts), then records a check
receipt. Two ticks at once never start two jobs for one slot: a slot is only
used by the tick that holds its lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from aiworker.config.limits import Housekeeping
from aiworker.core.context import Environment
from aiworker.core.maintenance.storage import space_shortage
from aiworker.core.scheduler_state import SchedulerState, record_check, record_poll
from aiworker.core.scheduling.claims import claim_for_slot
from aiworker.core.scheduling.launcher import launch, start_delivery_steps
from aiworker.core.scheduling.phase_commands import runnable_kinds
from aiworker.core.scheduling.units import refuse_direct_launch_in_a_service
from aiworker.core.scheduling.wakeup import TickReport
from aiworker.core.tasks.states import AWAITING_WORK
from aiworker.errors import EXIT_INVALID, AiworkerError, LockHeld, SchemaMismatch, Unavailable
from aiworker.runtime.artifact_files import RETENTION_STAMP
from aiworker.runtime.locks import FileLock
from aiworker.store.claims import active_claims, claimed_on
from aiworker.store.controllers import renew
from aiworker.store.deadlines import open_attempts_before, work_started_before
from aiworker.store.engine import Database
from aiworker.store.tables import WORKER_JOB_EVENTS
from aiworker.store.tasks import append_event, has_open_attempts, prune_events

if TYPE_CHECKING:
    from aiworker.core.intake.discovery import PollReport

CHECK_EVENT = "scheduler.check"

log = logging.getLogger(__name__)


def tick(env: Environment, *, poll_forge: bool = True) -> TickReport:
    # Paused: nothing new starts, but what dead jobs left is still recovered and
    # finished tasks are still cleaned up.
    paused = SchedulerState.load(env.state_dir).paused
    if not paused:
        refuse_direct_launch_in_a_service(env.loaded.config.scheduler.launcher)
    env.ensure_state_dir()  # before the database: the installation's key is made there
    env.ensure_restored()
    db = env.open_database()  # refused before the tick makes anything (its lock) there
    try:
        gate = _refuse_during_maintenance(env, paused)
        try:
            return _tick(env, db, paused, poll_forge)
        finally:
            gate.release()
    finally:
        db.dispose()


def _tick(env: Environment, db: Database, paused: bool, poll_forge: bool) -> TickReport:
    report = TickReport()
    began = datetime.now(UTC).isoformat()  # a check requested from now on is not this one
    config = env.loaded.config
    _refuse_a_skewed_clock(db)
    # First, before the poll and any claim: the other controllers see this one alive,
    # and a second installation using this controller.id is refused having done nothing.
    with db.transaction() as connection:
        renew(connection, env.controller_id, db.instance, timedelta(seconds=db.lease_s))
    if paused:
        report.status = "paused"
    elif poll_forge and config.forge is not None and config.repositories:
        _poll(env, report)
    starting = not paused and report.poll_error is None and not _short_of_space(env, report)
    own = _free_slots(env, report)
    try:
        report.recovered = _recover(env, db, [s for s, _ in own])
        report.guests_swept = _sweep_guests(env)
        # Only while work may start: paused, unpolled or short of space, nothing could
        # have moved the tasks on, so none is ended for its time.
        if starting:
            report.stuck, report.expired = _end_overdue(env, db)
        kinds, report.skipped = runnable_kinds(env)
        if starting:
            for slot, lock in own:
                with db.read_connection() as connection:
                    if claimed_on(connection, slot, db.host) is not None:
                        continue  # a fresh claim made by hand keeps its slot
                claim = claim_for_slot(env, db, slot, kinds, unless_paused=True)
                if claim is None:
                    break  # nothing eligible (or paused): so for the other slots too
                report.started.append(launch(env, db, slot, lock, claim.task_id))
    finally:
        for _, lock in own:
            lock.release()
    if starting and SchedulerState.load(env.state_dir).paused:
        starting, report.status = False, "paused"  # paused while this tick ran
    if starting:
        report.delivering = start_delivery_steps(env, db)
    report.cleaned = _keep_house(env, db)
    report.retention = _retention(env, db)
    now = datetime.now(UTC)
    report.next_deadline = (now + timedelta(seconds=config.check_interval)).isoformat()
    with db.transaction() as connection:
        renew(connection, env.controller_id, db.instance)  # after what may have taken long
        append_event(connection, CHECK_EVENT, actor="scheduler", data=report.to_json())
        _prune(connection, config.housekeeping)
    record_check(env, began, now.isoformat(), report.next_deadline)
    log.info(
        "tick: %s; %d started, %d steps, %d recovered",
        report.status,
        len(report.started),
        len(report.delivering),
        len(report.recovered),
    )
    return report


def _refuse_during_maintenance(env: Environment, paused: bool) -> FileLock:
    """maintenance.lock, shared for the whole tick, so that no maintenance operation
    (a copy of the store, a new guest image) starts while the tick claims and starts
    work; held by one already: refused, unless paused (then recovery and clean-up go on,
    and the lock is returned not held)."""
    maintenance = env.locks.lock("maintenance")
    if not maintenance.try_share() and not paused:
        raise Unavailable("maintenance is in progress; no work is started")
    return maintenance


def _refuse_a_skewed_clock(db: Database) -> None:
    """On PostgreSQL: several controllers compare the times they stamp with their clocks."""
    if db.sqlite:
        return
    from aiworker.core.tasks.hosts import clock_skew_problem

    problem = clock_skew_problem(db)
    if problem is not None and problem[0] == "fail":
        raise ClockSkewed(f"{problem[1]}; nothing was done")
    if problem is not None:
        log.warning("tick: %s", problem[1])


class ClockSkewed(AiworkerError):
    """This host's clock is too far off the database server's for leases to be judged:
    the installation must fix it (exit 2)."""

    code = "clock_skewed"
    exit_code = EXIT_INVALID


def _short_of_space(env: Environment, report: TickReport) -> bool:
    """Under the free-space reserve: nothing new starts, and the report says why."""
    report.low_space = space_shortage(env)
    if report.low_space is not None:
        log.warning("tick: %s", report.low_space)
    return report.low_space is not None


def _recover(env: Environment, db: Database, own_slots: list[int]) -> list[dict[str, Any]]:
    """Recovery is imported only when there is a claim or an open attempt to look at: an
    idle tick stays as cheap as its imports (benchmarks/tick)."""
    with db.read_connection() as connection:
        if not active_claims(connection) and not has_open_attempts(connection):
            return []
    from aiworker.core.tasks.recovery import recover_attempts, recover_slots

    found = [*recover_slots(env, db, own_slots), *recover_attempts(env, db)]
    return [{"task": r.task, "state": r.state, "reason": r.reason} for r in found]


def _end_overdue(env: Environment, db: Database) -> tuple[list[Any], list[Any]]:
    """This host's jobs stuck long past their task's deadline are stopped, then idle tasks
    past their deadline end as failed (before anything claims them); (stopped, ended).
    The deadlines module is imported only when some task worked that long ago."""
    limits = env.loaded.config.deadlines
    if limits.task <= 0:
        return [], []
    now = datetime.now(UTC)
    before = now - timedelta(seconds=limits.task)
    with db.read_connection() as connection:
        waiting = work_started_before(connection, before, sorted(AWAITING_WORK))
        running = open_attempts_before(connection, now - timedelta(seconds=limits.stuck), db.host)
    if not waiting and not running:
        return [], []
    from aiworker.core.tasks.deadlines import end_overdue, stop_stuck

    stopped = stop_stuck(env, db) if running else []
    return stopped, end_overdue(env, db) if waiting or stopped else []


def _sweep_guests(env: Environment) -> list[str]:
    """Guests whose job died (their QEMU died with it): overlays and folders removed. The
    guest module is imported only when some guest folder exists."""
    from aiworker.core.guests.paths import guests_root

    run = guests_root(env) / "run"
    if not run.is_dir() or not any(run.iterdir()):
        return []
    from aiworker.runtime.guests.guest import sweep_guests
    from aiworker.runtime.guests.images import ImageStore

    return sweep_guests(ImageStore(run.parent))


def _keep_house(env: Environment, db: Database) -> list[dict[str, Any]]:
    """Cleanup is imported only when some task has files on disk (an idle tick has none)."""
    folders = (env.state_dir / "workspaces", env.state_dir / "logs")
    if not any(n.startswith("task-") for f in folders if f.is_dir() for n in os.listdir(f)):
        return []
    from aiworker.core.maintenance.cleanup import cleanup

    return cleanup(env, db).removed


def _retention(env: Environment, db: Database) -> dict[str, int] | None:
    """The retention pass, once per retention.interval_s (an idle tick pays one stat)."""
    root = env.state_dir / "artifacts"
    try:
        age = time.time() - (root / RETENTION_STAMP).stat().st_mtime
        if age < env.loaded.config.retention.interval_s:
            return None
    except FileNotFoundError:
        if not root.is_dir() and not (env.state_dir / "git-cache").is_dir():
            return None
    from aiworker.core.maintenance.retention import retention_pass

    try:
        report = retention_pass(env, db)
    except LockHeld:
        return None  # a backup or another pass runs: the next tick tries again
    except (AiworkerError, OSError) as exc:
        # The tick goes on; the pass waits its interval (a pass that fails each time
        # must not fail every tick), and says why in the log.
        log.warning("tick: the retention pass failed: %s", exc)
        with contextlib.suppress(OSError):
            root.mkdir(mode=0o700, exist_ok=True)
            (root / RETENTION_STAMP).touch()
        return {"failed": 1}
    return {
        "payloads_removed": len(report.removed),
        "refs_removed": len(report.refs),
        "files_removed": len(report.files),
        "freed_bytes": report.freed_bytes,
    }


def _poll(env: Environment, report: TickReport) -> None:
    try:
        report.poll = poll_recorded(env).to_json()
    except AiworkerError as exc:
        # Authorisation could not be verified: start nothing this time.
        report.poll_error, report.poll_exit = exc.message, exc.exit_code


def poll_recorded(env: Environment, *, full: bool = False) -> PollReport:
    """Poll the forge and record the outcome (the error, failures in a row) for status and
    doctor; an error is raised again."""
    from aiworker.core.forge_access import ForgeAccess
    from aiworker.core.intake.discovery import poll

    try:
        report = poll(env, ForgeAccess(env.loaded), full=full)
    except SchemaMismatch:
        # The store's, not the poll's: every command names it until `db upgrade`, after
        # which a recorded failure would still say to run it.
        raise
    except AiworkerError as exc:
        with contextlib.suppress(OSError):  # the poll's own error is the one to report
            record_poll(env, exc.message, datetime.now(UTC), exc.exit_code)
        raise
    record_poll(env, None, datetime.now(UTC))
    return report


def _free_slots(env: Environment, report: TickReport) -> list[tuple[int, FileLock]]:
    own = []
    for slot in range(1, env.loaded.config.shares + 1):
        lock = env.locks.slot(slot)
        if lock.try_acquire():
            own.append((slot, lock))
        else:
            report.busy_slots.append(slot)
    return own


def _prune(connection: Any, housekeeping: Housekeeping) -> None:
    """Keep the latest check events and worker job events (per kind), not every one."""
    prune_events(connection, CHECK_EVENT, housekeeping.check_events)
    for kind in WORKER_JOB_EVENTS:
        prune_events(connection, kind, housekeeping.worker_job_events)
