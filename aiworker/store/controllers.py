"""Controllers sharing one database: each one's last sign of life.

Every tick and every running job renews its controller's row. Another controller
recovers a host's claims and attempts only once that host has been silent for longer
than the lease: never while it still renews, whatever its locks (which live on its own
disk) would say. Signs of life are written and judged by the database server's clock
(server_now), so controllers whose clocks disagree still agree on who is silent.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from aiworker.errors import ControllerIdInUse
from aiworker.store.engine import Database
from aiworker.store.tables import controllers, utcnow

log = logging.getLogger(__name__)


def renew(
    connection: Connection,
    host: str,
    instance: str | None = None,
    lease: timedelta | None = None,
    now: datetime | None = None,
) -> None:
    """Record that HOST, running as INSTANCE, is alive now (its first renewal also records
    when it started), in the caller's write transaction: under the write lock,
    read-then-write cannot race. LEASE (this controller's) is recorded: others wait as
    long before they count it gone. With LEASE: refused (ControllerIdInUse) while another
    instance renewed HOST within the lease; past it, this instance takes the id over (a
    host whose state directory moved)."""
    now = now or server_now(connection)
    row = connection.execute(
        select(controllers.c.instance, controllers.c.seen_at).where(controllers.c.id == host)
    ).first()
    lease_s = None if lease is None else int(lease.total_seconds())
    if row is None:
        connection.execute(
            insert(controllers).values(
                id=host, seen_at=now, started_at=now, instance=instance, lease_s=lease_s
            )
        )
        return
    other, seen = row
    if other is not None and instance is not None and not same_installation(other, instance):
        if lease is None:
            return  # a job's heartbeat: the id went to another installation meanwhile
        if now - seen <= lease:
            raise ControllerIdInUse(
                f"controller id {host!r} is in use by another installation ({_shown(other)}),"
                f" which renewed it {max(0, int((now - seen).total_seconds()))} s ago; this "
                f"one is {_shown(instance)}. Give each controller its own controller.id in "
                "its configuration"
            )
    changed: dict[str, Any] = {"seen_at": now}
    if instance is not None:
        changed["instance"] = instance
    if lease_s is not None:
        changed["lease_s"] = lease_s
    connection.execute(update(controllers).where(controllers.c.id == host).values(**changed))


def server_now(connection: Connection) -> datetime:
    """The database server's time now; on SQLite this host's (one host, one clock)."""
    if connection.dialect.name == "sqlite":
        return utcnow()
    now = connection.exec_driver_sql("SELECT clock_timestamp()").scalar()
    assert isinstance(now, datetime)
    return now.astimezone(UTC)


def same_installation(recorded: str, instance: str) -> bool:
    """Whether RECORDED names the installation INSTANCE does. An instance is 'KEY.MACHINE
    WHERE': the key is compared, WHERE (host and state directory) only shown. Versions
    before the key recorded 'WHERE (machine MACHINE)': the same where on the same machine
    is the same installation, upgraded."""
    key, _, where = instance.partition(" ")
    if recorded.endswith(")") and " (machine " in recorded:
        was, _, machine = recorded[:-1].partition(" (machine ")
        return was == where and key.partition(".")[2] == machine
    return recorded.split(" ", 1)[0] == key


def _shown(instance: str) -> str:
    if instance.endswith(")") and " (machine " in instance:
        return instance.partition(" (machine ")[0]
    return instance.split(" ", 1)[-1]


class Sighting(NamedTuple):
    at: datetime  # its last sign of life
    lease_s: int | None  # the lease it renews within (its own controller.lease)
    # How long the observer has watched it unchanged, in real time; None: not watched.
    watched_s: float | None = None


def last_seen(connection: Connection, *, judged: bool = False) -> dict[str, Sighting]:
    """Each controller's last sign of life, and its own lease. JUDGED (whether it is
    gone): none could renew while the database server was down, so a sign older than the
    server's start counts from it (a PostgreSQL restart, an upgrade, its host rebooted),
    and a controller whose jobs ran on through the outage is not taken for gone the
    moment it is back; shown, each is as it was recorded."""
    columns = (controllers.c.id, controllers.c.seen_at, controllers.c.lease_s)
    started = None
    if judged and connection.dialect.name == "postgresql":
        started = connection.exec_driver_sql("SELECT pg_postmaster_start_time()").scalar()
    return {
        str(host): Sighting(max(at, started) if started else at, lease)
        for host, at, lease in connection.execute(select(*columns))
    }


def silent_since(
    seen: dict[str, Sighting], host: str, lease: timedelta, now: datetime
) -> datetime | None:
    """When HOST fell silent, if it has been silent for longer than LEASE or its own
    lease, whichever is longer (a controller that ticks rarely renews rarely; never seen
    at all counts as silent since the epoch); None while it is within its lease."""
    sighting = seen.get(host)
    if sighting is None:
        return datetime.min.replace(tzinfo=now.tzinfo)
    return None if now - sighting.at <= lease_of(seen, host, lease) else sighting.at


def lease_of(seen: dict[str, Sighting], host: str, lease: timedelta) -> timedelta:
    """How long HOST may stay silent: LEASE (the observer's) or its own, the longer."""
    sighting = seen.get(host)
    return max(lease, timedelta(seconds=(sighting and sighting.lease_s) or 0))


class Heartbeat:
    """While a job runs, renew its controller every quarter of the lease, from a daemon
    thread; a renewal that fails (the database away for a moment) is logged and tried
    again at the next beat. Does nothing for a database opened for no controller."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        if self.db.host is not None:
            self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
            self._thread.start()
        return self

    def _beat(self) -> None:
        host = self.db.host
        assert host is not None
        while not self._stop.wait(self.db.lease_s / 4):
            try:
                with self.db.transaction() as connection:
                    renew(connection, host, self.db.instance)
            except Exception as exc:
                log.warning("controller %s: sign of life not recorded: %s", host, exc)

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
