"""Controllers sharing one database: each one's last sign of life.

Every tick and every running job renews its controller's row. Another controller
recovers a host's claims and attempts only once that host has been silent for longer
than the lease: never while it still renews, whatever its locks (which live on its own
disk) would say.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

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
    read-then-write cannot race. With LEASE: refused (ControllerIdInUse) while another
    instance renewed HOST within the lease; past it, this instance takes the id over (a
    host whose state directory moved)."""
    now = now or utcnow()
    row = connection.execute(
        select(controllers.c.instance, controllers.c.seen_at).where(controllers.c.id == host)
    ).first()
    if row is None:
        values = {"id": host, "seen_at": now, "started_at": now, "instance": instance}
        connection.execute(insert(controllers).values(**values))
        return
    other, seen = row
    if lease is not None and other not in (None, instance) and now - seen <= lease:
        raise ControllerIdInUse(
            f"controller id {host!r} is in use by another installation ({other}), which "
            f"renewed it {max(0, int((now - seen).total_seconds()))} s ago; this one is "
            f"{instance}. Give each controller its own controller.id in its configuration"
        )
    changed = {"seen_at": now} if instance is None else {"seen_at": now, "instance": instance}
    connection.execute(update(controllers).where(controllers.c.id == host).values(**changed))


def last_seen(connection: Connection) -> dict[str, datetime]:
    """Each controller's last sign of life."""
    rows = connection.execute(select(controllers.c.id, controllers.c.seen_at))
    return {str(host): seen for host, seen in rows}


def silent_since(
    seen: dict[str, datetime], host: str, lease: timedelta, now: datetime
) -> datetime | None:
    """When HOST fell silent, if it has been silent for longer than LEASE (never seen at
    all counts as silent since the epoch); None while it is within its lease."""
    at = seen.get(host)
    if at is not None and now - at <= lease:
        return None
    return at or datetime.min.replace(tzinfo=now.tzinfo)


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
