"""Engine and session setup: the one place that knows which engine the store runs on.

SQLite runs in WAL mode with synchronous=FULL and foreign keys on; the busy
timeout is the first statement on every connection. Write transactions start
with BEGIN IMMEDIATE so that two writers never both read and then collide on
upgrade to a write lock.

PostgreSQL (psycopg 3) gives write transactions the same guarantee with a
transaction-scoped advisory lock taken as their first statement: every
read-then-write in store/ runs as it does on SQLite, one writer at a time, on any
number of hosts. Claims are the exception on both engines' hot path: one statement
that skips rows another claimer holds (FOR UPDATE SKIP LOCKED), outside that lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DatabaseError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session
from sqlalchemy.pool import PoolProxiedConnection

from aiworker.errors import (
    SHORT_ADVICE,
    AiworkerError,
    DiskFull,
    LockHeld,
    ShortOfResources,
    StateUnusable,
    Unavailable,
    out_of_descriptors,
)
from aiworker.store.driver import DriverConnection

# Session is re-exported: core types the sessions it passes to store/ by it.
__all__ = ["BUSY_TIMEOUT_MS", "Database", "Session", "default_url", "is_sqlite", "sqlite_path"]
BUSY_TIMEOUT_MS = 30_000
log = logging.getLogger(__name__)


def default_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / 'aiworker.db'}"


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def is_postgresql(url: str) -> bool:
    return url.startswith(("postgresql", "postgres://"))


def sqlite_path(url: str) -> Path | None:
    """The file a SQLite URL (either spelling of its driver) names; None for another URL."""
    for prefix in ("sqlite:///", "sqlite+pysqlite:///"):
        if url.startswith(prefix) and url != prefix and ":memory:" not in url:
            return Path(url[len(prefix) :].split("?", 1)[0])
    return None


def _on_sqlite_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
    # Driver-level autocommit: we issue BEGIN ourselves in _on_begin.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = FULL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _on_begin(connection: Connection) -> None:
    mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
    connection.exec_driver_sql(f"BEGIN {mode}")


def make_engine(url: str) -> Engine:
    if not is_sqlite(url):
        from aiworker.store import postgresql

        return postgresql.make_engine(url)
    path = sqlite_path(url)
    if path is not None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
    event.listen(engine, "connect", _on_sqlite_connect, insert=True)
    event.listen(engine, "begin", _on_begin)
    return engine


# What SQLite says when the database cannot be used as it is, and what to tell the
# operator instead (the path is put in front): exit 2 where they must act, 75 where
# waiting helps.
FAILURES: tuple[tuple[str, type[AiworkerError], str], ...] = (
    (
        "readonly database",
        StateUnusable,
        "is read-only (the file, its folder or its file system); nothing was written: make "
        "it writable for this user, or use another --state-dir",
    ),
    (
        "database is locked",
        LockHeld,
        f"stayed locked by another process for more than {BUSY_TIMEOUT_MS // 1000} s; try "
        "again, and if it lasts find the holder (`fuser` on the file)",
    ),
    (
        "unable to open database file",
        StateUnusable,
        "cannot be opened (its folder is missing, not writable, or on a read-only file "
        "system); nothing was written",
    ),
    (
        "malformed",
        StateUnusable,
        "is damaged; restore it from a backup (`aiworker db backup` made one)",
    ),
    ("disk i/o error", StateUnusable, "could not be read or written (disk I/O error)"),
    ("database or disk is full", DiskFull, "cannot grow: the disk is full; free space"),
)


def _full(path: Path) -> bool:
    """Whether PATH's file system has less than a page or two left."""
    try:
        stats = os.statvfs(path.parent)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < 64 * 1024


def explained(url: str, exc: BaseException) -> AiworkerError | None:
    """EXC (a driver's operational error) as an error naming the database and the fix."""
    if not is_sqlite(url):
        from aiworker.store import postgresql

        return postgresql.explained(url, exc)
    text = str(getattr(exc, "orig", exc)).lower()
    path = sqlite_path(url)
    where = str(path or "the database")
    if "disk i/o error" in text and path is not None and _full(path):
        # SQLite says I/O error when it cannot make its journal files on a full disk.
        text = "database or disk is full"
    if "unable to open database file" in text and out_of_descriptors():
        return ShortOfResources(f"{where} cannot be opened: {SHORT_ADVICE}")
    for needle, kind, advice in FAILURES:
        if needle in text:
            return kind(f"{where} {advice}")
    return None


class Database:
    """One database: read sessions and serialised write sessions. A database that
    cannot be used as it is (read-only, locked past the busy timeout, damaged) raises an
    error naming it and what to do, not the driver's own."""

    def __init__(
        self, url: str, host: str | None = None, lease_s: float = 300, instance: str | None = None
    ) -> None:
        self.url = url
        # The controller (controller.id) this process acts for: claims and attempts record
        # it, and its jobs renew its sign of life every quarter of LEASE_S. None: a tool or
        # test that acts for no controller. INSTANCE says where it runs (host, state
        # directory, machine): two installations with one id are told apart by it.
        self.host = host
        self.lease_s = lease_s
        self.instance = instance
        self.engine = make_engine(url)
        self.sqlite = is_sqlite(url)
        # Seconds a session waits for a PostgreSQL server that is down (a job's, set by
        # its driver); none: fail at once.
        self.patience = 0.0
        self.write_engine = (
            self.engine.execution_options(sqlite_begin="IMMEDIATE")
            if self.sqlite
            else self.engine.execution_options(serialised=True)
        )
        self._driver = threading.local()
        self._driver_connections: list[PoolProxiedConnection] = []
        self._held: dict[str, PoolProxiedConnection] = {}

    @contextlib.contextmanager
    def explaining(self) -> Iterator[None]:
        """Driver failures inside as errors naming the database and what to do."""
        # The claim path runs on the driver's own cursor: its errors are the driver's.
        dbapi = self.engine.dialect.loaded_dbapi
        driver = getattr(dbapi, "OperationalError", OperationalError)
        # A privilege the role lacks is a programming error to the driver.
        privilege = getattr(dbapi, "ProgrammingError", ProgrammingError)
        try:
            yield
        except (
            OperationalError,
            ProgrammingError,
            sqlite3.OperationalError,
            driver,
            privilege,
        ) as exc:
            text = str(exc).lower()
            # The server's refusals of the setup, as the driver words them.
            refused = "permission denied" in text or "invalid connection option" in text
            if isinstance(exc, ProgrammingError | privilege) and not refused:
                raise  # a statement's own mistake (a missing table, say): not the setup's
            named = explained(self.url, exc)
            if named is None:
                raise
            raise named from None
        except (DatabaseError, sqlite3.DatabaseError) as exc:
            # A damaged SQLite file is the driver's DatabaseError, not an operational one;
            # so is a write on a read-only PostgreSQL server (a standby).
            named = explained(self.url, exc)
            if named is None:
                raise
            raise named from None

    def await_server(self) -> None:
        """A PostgreSQL server that is down or restarting is waited for, up to PATIENCE
        seconds, before a session begins: a job's records (its attempt, its result) then
        outlast a short outage; a tick or a command (no patience) fails at once."""
        if not self.patience or self.sqlite:
            return
        deadline = time.monotonic() + self.patience
        delay = 0.5
        while True:
            try:
                with self.explaining(), self.engine.connect() as connection:
                    connection.exec_driver_sql("SELECT 1")
                return
            except Unavailable as exc:
                if isinstance(exc, LockHeld) or time.monotonic() + delay > deadline:
                    raise
                log.warning(
                    "%s; waiting for it (%.0f s more at most)",
                    exc.message,
                    deadline - time.monotonic(),
                )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def write(self) -> contextlib.AbstractContextManager[Session]:
        """A session whose transaction holds the write lock from its first statement."""
        return self._session(self.write_engine)

    def read(self) -> contextlib.AbstractContextManager[Session]:
        return self._session(self.engine)

    @contextlib.contextmanager
    def _session(self, engine: Engine) -> Iterator[Session]:
        self.await_server()
        with (
            self.explaining(),
            Session(engine, expire_on_commit=False) as session,
            session.begin(),
        ):
            yield session

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A bare connection in a write transaction: the lean path for hot statements."""
        self.await_server()
        with self.explaining(), self.write_engine.begin() as connection:
            yield connection

    @contextlib.contextmanager
    def driver_transaction(self, *, one_statement: bool = False) -> Iterator[DriverConnection]:
        """The DB-API connection in a write transaction, for DriverStatements only: the
        claim path, where SQLAlchemy's transaction object costs more than the claim.
        ONE_STATEMENT: the caller runs exactly one statement, which on PostgreSQL then
        is its own transaction (autocommit: no BEGIN and COMMIT round trips).

        The connection stays checked out (one per thread) until dispose(): a pool round
        trip between two claims leaves the write lock free long enough for a waiting
        process to take it, and then this one sleeps in SQLite's busy handler. On
        PostgreSQL it takes no lock: a claim is one statement that skips held rows.
        """
        with self.explaining():
            pooled = getattr(self._driver, "pooled", None)
            if pooled is None:
                pooled = self._driver.pooled = self.engine.raw_connection()
                self._driver_connections.append(pooled)
                if not self.sqlite:
                    from aiworker.store import postgresql

                    postgresql.plan_once(pooled.dbapi_connection)
            dbapi = pooled.dbapi_connection
            if self.sqlite:
                dbapi.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
            else:
                dbapi.rollback()  # type: ignore[union-attr]  # start clean; the driver begins
                dbapi.autocommit = one_statement  # type: ignore[union-attr]
            try:
                yield DriverConnection(dbapi, self.engine.dialect)
                dbapi.commit()  # type: ignore[union-attr]
            except BaseException:
                # Also when COMMIT itself fails: the kept connection must not stay in a
                # transaction. One the server dropped is replaced at the next claim.
                if self.sqlite or not dbapi.closed:  # type: ignore[union-attr]
                    dbapi.rollback()  # type: ignore[union-attr]
                else:
                    self._driver_connections.remove(pooled)
                    self._driver.pooled = None
                    pooled.invalidate()
                raise

    @contextlib.contextmanager
    def read_connection(self, snapshot: bool = False) -> Iterator[Connection]:
        """A bare connection in a read transaction: no ORM on the way. SNAPSHOT: every
        statement sees the same moment (PostgreSQL's default, READ COMMITTED, takes a new
        snapshot per statement; a SQLite read transaction keeps its first one anyway)."""
        self.await_server()
        with self.explaining(), self.engine.connect() as bare:
            connection = (
                bare.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
                if snapshot and not self.sqlite
                else bare
            )
            with connection.begin():
                yield connection

    def server(self) -> tuple[str, float]:
        """The engine and its version ("PostgreSQL 15.14 at host:port/db", "SQLite 3.40.1"),
        and the median of three round trips of a trivial query, in milliseconds."""
        with self.explaining(), self.engine.connect() as connection:
            trips = []
            for _ in range(3):
                started = time.perf_counter()
                connection.exec_driver_sql("SELECT 1").scalar()
                trips.append((time.perf_counter() - started) * 1000)
            if self.sqlite:
                name = f"SQLite {sqlite3.sqlite_version}"
            else:
                from aiworker.store import postgresql

                version = postgresql.server_version(connection)
                name = postgresql.where(self.url).replace("PostgreSQL", f"PostgreSQL {version}")
        return name, sorted(trips)[1]

    def clock_skew(self) -> float | None:
        """Seconds the database server's clock is ahead of this host's (negative: behind),
        judged at the middle of one round trip; None on SQLite (one host, one clock)."""
        if self.sqlite:
            return None
        with self.explaining(), self.engine.connect() as connection:
            before = time.time()
            server = connection.exec_driver_sql(
                "SELECT extract(epoch from clock_timestamp())"
            ).scalar()
            after = time.time()
        assert server is not None
        return float(server) - (before + after) / 2

    def hold(self, name: str) -> bool:
        """Hold lock NAME for every controller sharing this database, until release(NAME)
        or dispose(); False when another holds it. On PostgreSQL a session
        lock on a connection of its own, which the server frees when this process or its
        host goes away; SQLite serves one host, where the caller's file lock is the lock."""
        if self.sqlite or name in self._held:
            return True
        from aiworker.store import postgresql

        with self.explaining():
            connection = postgresql.try_hold(self.engine, name)
        if connection is None:
            return False
        self._held[name] = connection
        return True

    def release(self, name: str) -> None:
        held = self._held.pop(name, None)
        if held is not None:
            held.invalidate()  # closed, not pooled: closing is what frees the lock

    def dispose(self) -> None:
        for name in list(self._held):
            self.release(name)
        for pooled in self._driver_connections:
            if self.sqlite:
                pooled.close()
            else:  # closed, not pooled: its session settings are the claims' own
                pooled.invalidate()
        self._driver_connections.clear()
        self._driver = threading.local()
        self.engine.dispose()
