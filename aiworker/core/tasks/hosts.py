"""Whose work it is when several controllers share the database: this controller's, or
another's that still renews its sign of life (store/controllers.py). Only a controller
silent for longer than its lease gives up its claims, attempts and unpublished work."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from aiworker.core.context import Environment, hold_job_lock
from aiworker.core.tasks.signs_of_life import watched
from aiworker.errors import LockHeld
from aiworker.runtime.locks import FileLock
from aiworker.store.controllers import Sighting, last_seen, lease_of, server_now, silent_since
from aiworker.store.engine import Database
from aiworker.store.tasks import task_state


def ours(db: Database, host: str | None) -> bool:
    """A claim or attempt of this controller (None: recorded before hosts were)."""
    return host is None or host == db.host


SKEW_WARN_S = 2.0


def clock_skew_problem(db: Database) -> tuple[str, str] | None:
    """("warn" or "fail", why) when this host's clock is off the database server's. Signs
    of life go by the server's clock, but claims, attempts, deadlines and runner leases
    are stamped with this host's, which the others compare with theirs: a quarter of
    the lease off is refused. None when in step (or on SQLite)."""
    skew = db.clock_skew()
    if skew is None or abs(skew) <= SKEW_WARN_S:
        return None
    way = "behind" if skew > 0 else "ahead of"
    why = (
        f"this host's clock is {abs(skew):.0f} s {way} the database server's; the "
        "controllers compare the times they stamp on claims and attempts: keep the clocks in "
        "step (NTP)"
    )
    return ("fail" if abs(skew) > db.lease_s / 4 else "warn"), why


def gone(
    db: Database, seen: dict[str, Sighting], host: str, now: datetime, since: datetime | None
) -> str | None:
    """Why HOST's work is given up (it fell silent for longer than the lease), or None
    while it still renews. SINCE: when the claim or attempt was made, a sign of life too."""
    lease = timedelta(seconds=db.lease_s)
    if since is not None and timedelta(0) <= now - since <= lease:
        return None  # (one in the future: this clock was set back since; not a sign)
    sighting = seen.get(host)
    if sighting is not None and sighting.watched_s is not None:
        # Watched here: real time alone decides, whatever the wall clock did meanwhile.
        if sighting.watched_s <= lease_of(seen, host, lease).total_seconds():
            return None
        silent: datetime | None = sighting.at
    else:
        silent = silent_since(seen, host, lease, now)
    if silent is None:
        return None
    when = "never seen" if silent.year == 1 else f"silent since {silent.isoformat()}"
    waited = int(lease_of(seen, host, lease).total_seconds())
    return f"controller {host} is gone ({when}; lease {waited} s)"


def _alive(env: Environment, db: Database, hosts: Iterable[str]) -> set[str]:
    """Of HOSTS (other controllers), those that still renew."""
    with db.read_connection() as connection:
        seen = watched(env.state_dir, last_seen(connection, judged=True))
        now = server_now(connection)
    return {host for host in hosts if gone(db, seen, host, now, None) is None}


def published_elsewhere(env: Environment, db: Database, task_ids: list[int]) -> set[int]:
    """Of TASK_IDS, those whose unpublished commits another live controller holds (the
    host of their last implementation or repair); one gone leaves them to any host."""
    if not task_ids:
        return set()
    from aiworker.store.attempts import work_hosts  # the ORM: not for an idle tick (12 ms)

    with db.read() as session:
        hosts = {t: h for t, h in work_hosts(session, task_ids).items() if h != env.controller_id}
    alive = _alive(env, db, set(hosts.values())) if hosts else set()
    return {task for task, host in hosts.items() if host in alive}


def hold_task_lock(
    env: Environment, db: Database, task_id: int, state: str, version: int
) -> FileLock | None:
    """hold_job_lock for task-TASK_ID's step, for every controller sharing the database:
    the lock is also held there (another host may run the same step); no other live
    controller may have an open attempt of the task (a step whose lock the database lost
    in a restart still runs); and the task must still be at STATE and VERSION once held
    (a step that finished meanwhile moved it on). Returns what hold_job_lock returns."""
    from aiworker.store.attempts import open_attempts  # the ORM: not for an idle tick

    name = f"task-{task_id}"
    lock = hold_job_lock(env, name)
    try:
        if not db.hold(name):
            raise LockHeld(f"a step of task {task_id} is running on another controller")
        with db.read() as session:
            hosts = {a.host for a in open_attempts(session, task_id) if not ours(db, a.host)}
        running = sorted(_alive(env, db, {h for h in hosts if h})) if hosts else []
        if running:
            raise LockHeld(f"a step of task {task_id} is running on controller {running[0]}")
        with db.read_connection() as connection:
            now = task_state(connection, task_id)
        if now != (state, version):
            found = "gone" if now is None else f"{now[0]} at version {now[1]}"
            raise LockHeld(f"task {task_id} moved on ({found}) before its step began")
    except BaseException:
        db.release(name)
        if lock is not None:
            lock.release()
        raise
    return lock
