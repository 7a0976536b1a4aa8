"""What is particular to PostgreSQL: the driver, the write lock, the server's failures
explained, and backups through pg_dump. Nothing above store/ imports this."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url

from aiworker.errors import (
    AiworkerError,
    ConfigInvalid,
    DiskFull,
    LockHeld,
    StateUnusable,
    Unavailable,
)
from aiworker.runtime.atomic import new_file

# The advisory lock every write transaction takes first ("aiwwrite"): transaction-scoped,
# freed by COMMIT or ROLLBACK, and by the server when a client dies. Migrations run in one
# write transaction, so two hosts upgrading at once take turns.
WRITE_LOCK_KEY = 0x6169_7777_7269_7465
# How long a connection attempt may take before the server counts as unreachable, and
# how long a statement waits for a lock (SQLite's busy timeout is the same 30 s).
CONNECT_TIMEOUT_S = 10
LOCK_TIMEOUT_MS = 30_000
KEEPALIVES = ("tcp_keepalives_idle=20", "tcp_keepalives_interval=5", "tcp_keepalives_count=4")
# The same on this side (libpq's): a client waiting for an answer on a connection whose
# network went (a cable, a route, a firewall) learns it within a minute, instead of
# waiting for ever on a socket nothing will ever arrive on.
CLIENT_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 20,
    "keepalives_interval": 5,
    "keepalives_count": 4,
    "tcp_user_timeout": 60_000,  # ms: what was sent and never acknowledged
}
# The namespace of the named locks held across controllers (pg_try_advisory_lock(int, int):
# a key space apart from the write lock's bigint).
NAMED_LOCKS = 0x61697721


def driver_url(url: str) -> str:
    """URL with its driver named: psycopg 3 for postgresql:// (the driver we ship)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _on_begin(connection: Connection) -> None:
    if connection.get_execution_options().get("serialised"):
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")


# PostgreSQL's text refuses the NUL character, which SQLite keeps (a dead job's log tail,
# copied into a reason, may hold one): written as U+FFFD, the replacement character.
NUL, REPLACEMENT = "\x00", "\ufffd"


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace(NUL, REPLACEMENT) if NUL in value else value
    if isinstance(value, dict):
        return {key: _without_nul(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_without_nul(item) for item in value)
    return value


def _text_without_nul(
    _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool
) -> tuple[str, Any]:
    return statement, _without_nul(parameters)


def make_engine(url: str) -> Engine:
    """An engine whose connections held with execution option `serialised` take the write
    lock as their transaction's first statement."""
    parsed = make_url(driver_url(url))
    # The server's keepalives notice a host that vanished within a minute, and free what
    # its sessions held (the write lock mid-transaction, a step's lock).
    options = [f"lock_timeout={LOCK_TIMEOUT_MS}", *KEEPALIVES]
    connect_args: dict[str, Any] = {"options": " ".join(f"-c {o}" for o in options)}
    defaults = {"connect_timeout": CONNECT_TIMEOUT_S, **CLIENT_KEEPALIVES}
    connect_args |= {k: v for k, v in defaults.items() if k not in parsed.query}
    engine = create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)
    event.listen(engine, "begin", _on_begin)
    event.listen(engine, "before_cursor_execute", _text_without_nul, retval=True)
    return engine


def where(url: str) -> str:
    """The server and database URL names, without user or password."""
    parsed = make_url(driver_url(url))
    return f"PostgreSQL at {parsed.host or 'localhost'}:{parsed.port or 5432}/{parsed.database}"


# What the server or libpq says, and what to tell the operator: exit 2 where they must act
# (the URL, the role, the database), 75 where waiting for the server helps.
FAILURES: tuple[tuple[str, type[AiworkerError], str], ...] = (
    # Every connection slot taken (max_connections, or the role's or the database's
    # connection limit; before the role's own errors, as its message names the role):
    # waiting helps, the setup is sound.
    ("too many clients", Unavailable, "has no free connection; try again"),
    ("too many connections", Unavailable, "has no free connection; try again"),
    ("remaining connection slots are reserved", Unavailable, "has no free connection; try again"),
    (
        "password authentication failed",
        ConfigInvalid,
        "refused the login: check database.url's user and password",
    ),
    ('role "', ConfigInvalid, "has no such role: check database.url's user"),
    (
        "does not exist",
        StateUnusable,
        "has no such database: create it (see the README's PostgreSQL section)",
    ),
    ("connection refused", Unavailable, "refuses connections: is the server running there?"),
    # The same over a Unix socket: its file is gone while the server is stopped.
    (
        "is the server running locally",
        Unavailable,
        "refuses connections: is the server running there?",
    ),
    ("timeout expired", Unavailable, "did not answer in time"),
    ("could not translate host name", ConfigInvalid, "names a host that does not resolve"),
    ("failed to resolve host", ConfigInvalid, "names a host that does not resolve"),
    (
        # PostgreSQL 15 lets only a database's owner create in its schema public.
        "permission denied for schema",
        ConfigInvalid,
        "does not let database.url's role create aiworker's tables: make the role the "
        "database's owner (createdb --owner ROLE; see the README's PostgreSQL section)",
    ),
    (
        "permission denied",
        ConfigInvalid,
        "denies database.url's role a privilege aiworker needs (to connect, or to read and "
        "write its tables): use the role that owns the database, or grant it",
    ),
    ("the database system is", Unavailable, "is starting up or shutting down; try again"),
    ("invalid connection option", ConfigInvalid, "cannot take an option database.url names"),
    ("invalid sslmode value", ConfigInvalid, "cannot take database.url's sslmode"),
    (
        "read-only transaction",
        Unavailable,
        "accepts no writes (a standby, or default_transaction_read_only is on): point "
        "database.url at the primary",
    ),
    ("server closed the connection", Unavailable, "closed the connection; try again"),
    # The network went under a connection (found by the keepalives), or before one.
    (
        "could not receive data from server",
        Unavailable,
        "was lost mid-answer (the network, or its host, went); try again",
    ),
    (
        "could not send data to server",
        Unavailable,
        "was lost mid-request (the network, or its host, went); try again",
    ),
    ("network is unreachable", Unavailable, "cannot be reached: no route to it from here"),
    ("no route to host", Unavailable, "cannot be reached: no route to it from here"),
    (
        "no password supplied",
        ConfigInvalid,
        "asks for a password database.url does not give: put it there, or in ~/.pgpass "
        "(mode 0600: libpq ignores a file others may read)",
    ),
    ("terminating connection", Unavailable, "ended the connection; try again"),
    ("no space left on device", DiskFull, "cannot write: its disk is full"),
    (
        "lock timeout",
        LockHeld,
        f"kept a lock held by another session for more than {LOCK_TIMEOUT_MS // 1000} s; "
        "try again, and if it lasts find the holder (pg_stat_activity)",
    ),
)


def explained(url: str, exc: BaseException) -> AiworkerError | None:
    text = str(getattr(exc, "orig", exc)).lower()
    for needle, kind, advice in FAILURES:
        if needle in text:
            return kind(f"{where(url)} {advice}")
    return None


def lock_key(name: str) -> int:
    """NAME as the second key of a named lock (a signed 32-bit integer)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), signed=True)


def try_hold(engine: Engine, name: str) -> Any | None:
    """A connection of its own holding the named lock NAME, or None when another session
    holds it: the lock lasts until that connection closes."""
    connection = engine.raw_connection()
    try:
        dbapi = connection.dbapi_connection
        dbapi.autocommit = True  # type: ignore[union-attr]
        row = dbapi.execute(  # type: ignore[union-attr]
            "SELECT pg_try_advisory_lock(%s, %s)", (NAMED_LOCKS, lock_key(name))
        ).fetchone()
        if row[0]:
            return connection
    except BaseException:
        connection.invalidate()
        raise
    # Discarded, not pooled: in autocommit, a write transaction on it would take the write
    # lock and lose it with that very statement.
    connection.invalidate()
    return None


def plan_once(dbapi: Any) -> None:
    """Set up the claims' own connection: its few fixed statements are prepared at their
    first run and planned once (a claim's planning otherwise costs as much as the claim:
    0.7 of 1.4 ms measured here)."""
    dbapi.prepare_threshold = 0
    dbapi.execute("SET plan_cache_mode = force_generic_plan")
    dbapi.commit()


def server_version(connection: Connection) -> str:
    return str(connection.exec_driver_sql("SHOW server_version").scalar()).split()[0]


def _client(name: str) -> str:
    """Debian installs the client programs per major version; the wrapper picks one."""
    found = shutil.which(name)
    if found is None:
        raise Unavailable(f"{name} is not installed (Debian: apt-get install postgresql-client)")
    return found


def _libpq_environment(url: str) -> tuple[list[str], dict[str, str]]:
    """pg_dump's connection arguments, the password through the environment (never argv)."""
    parsed = make_url(driver_url(url))
    env = {**os.environ, "PGCONNECT_TIMEOUT": str(CONNECT_TIMEOUT_S)}
    password = parsed.password or parsed.query.get("password")
    if password:
        env["PGPASSWORD"] = str(password)
    # The URL as the application uses it (a socket folder, sslmode, ...), less its password
    # in either place (URL.set(password=None) would keep it: None there means unchanged).
    bare = parsed._replace(drivername="postgresql", password=None)
    bare = bare.difference_update_query(["password"])
    return [f"--dbname={bare.render_as_string(hide_password=False)}"], env


def dump(url: str, target: Path) -> int:
    """pg_dump the database at URL to TARGET (which must not exist) in custom format, built
    beside it, checked with `pg_restore --list`, then linked into place; returns its size."""
    args, env = _libpq_environment(url)
    with new_file(target, owned=True) as tmp:
        done = subprocess.run(
            # A table another session holds exclusively fails the dump instead of hanging it.
            [
                _client("pg_dump"),
                "--format=custom",
                "--no-password",
                f"--lock-wait-timeout={LOCK_TIMEOUT_MS}",
                f"--file={tmp}",
                *args,
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise Unavailable(f"pg_dump of {where(url)} failed: {done.stderr.strip()[-400:]}")
        listed = subprocess.run(
            [_client("pg_restore"), "--list", str(tmp)], capture_output=True, text=True, check=False
        )
        if listed.returncode != 0 or "TABLE DATA public tasks" not in listed.stdout:
            raise Unavailable(f"pg_restore cannot read the dump of {where(url)}; nothing kept")
    return target.stat().st_size
