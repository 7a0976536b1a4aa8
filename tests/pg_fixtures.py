"""A real PostgreSQL server for the store's tests: Debian's PostgreSQL 15 binaries, one
private cluster per test process (initdb into a temporary folder, listening on loopback
and a socket folder of its own), and a fresh database per test.

The server runs as the postgres user (it refuses root). `.ci/run` installs the packages;
nothing here touches the system's own cluster.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PostgresServer:
    folder: Path
    port: int
    host: str = "127.0.0.1"
    user: str = "aiworker"
    password: str = ""

    def url(self, database: str, host: str | None = None) -> str:
        where = host or self.host
        return f"postgresql://{self.user}:{self.password}@{where}:{self.port}/{database}"

    def as_postgres(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["runuser", "-u", "postgres", "--", *argv],
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
            cwd="/",
        )

    def psql(self, sql: str, database: str = "postgres") -> str:
        done = self.as_postgres(
            str(BIN / "psql"), "-h", str(self.folder), "-p", str(self.port), "-d", database,
            "-v", "ON_ERROR_STOP=1", "-Atc", sql,
        )  # fmt: skip
        return done.stdout.strip()

    def create_database(self) -> str:
        name = f"t_{secrets.token_hex(6)}"
        self.psql(f"CREATE DATABASE {name} OWNER {self.user}")
        return name

    def pg_ctl(self, *args: str) -> None:
        data = self.folder / "data"
        self.as_postgres(str(BIN / "pg_ctl"), "-D", str(data), "-w", "-t", "60", *args)

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("stop", "-m", mode)

    def start(self) -> None:
        self.pg_ctl("-l", str(self.folder / "server.log"), "start")

    def restart(self) -> None:
        """Stop (ending every session at once) and start again; the log keeps the pipe
        free, or pg_ctl would wait for the server it started."""
        self.pg_ctl("-l", str(self.folder / "server.log"), "-m", "fast", "restart")


def start_server(listen: str = "127.0.0.1") -> PostgresServer:
    """initdb a cluster into a new folder and start it, listening on LISTEN (a comma
    separated list) and on a socket in its own folder."""
    if not (BIN / "initdb").exists():
        pytest.fail("PostgreSQL 15 is not installed (apt-get install postgresql-15)")
    folder = Path(tempfile.mkdtemp(prefix="aiw-pg-"))
    postgres = pwd.getpwnam("postgres")
    os.chown(folder, postgres.pw_uid, postgres.pw_gid)
    server = PostgresServer(folder, free_port(), password=secrets.token_hex(12))
    data = folder / "data"
    server.as_postgres(
        str(BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth-local=trust",
        "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync",
    )  # fmt: skip
    settings = {
        "listen_addresses": f"'{listen}'",
        "port": str(server.port),
        "unix_socket_directories": f"'{folder}'",
        "max_connections": "200",
        "shared_buffers": "32MB",
        "fsync": "on",
    }
    with (data / "postgresql.conf").open("a") as conf:
        conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
    with (data / "pg_hba.conf").open("a") as hba:
        hba.write("host all all 0.0.0.0/0 scram-sha-256\n")
    server.start()
    server.psql(f"CREATE ROLE {server.user} LOGIN PASSWORD '{server.password}'")
    return server


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = start_server()
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(server.folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> str:
    """A URL to a new, empty database on the session's server."""
    return postgres.url(postgres.create_database())


def configure_database(url: str, config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the CLI at URL through a configuration file of its own."""
    config.write_text(f'[database]\nurl = "{url}"\n')
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))


def rows(url: str, sql: str, **params: object) -> list[tuple]:
    """SQL's rows on the store at URL, whichever engine it is."""
    from sqlalchemy import create_engine, text

    from aiworker.store.postgresql import driver_url

    engine = create_engine(driver_url(url))
    try:
        with engine.begin() as connection:
            result = connection.execute(text(sql), params)
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()
