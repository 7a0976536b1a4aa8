"""db backup: a consistent, private snapshot of a database other processes write to."""

from __future__ import annotations

import os
import re
import shutil
import socket
import sqlite3
import stat
import subprocess
import sys
import time

import pytest

from tests.helpers import run_process
from tests.pg_fixtures import BIN, configure_database, rows

WRITER = """
import sys, time
from aiworker.store.engine import Database
from aiworker.store.tasks import append_event
db = Database(sys.argv[1])
print("ready", flush=True)
n = 0
while True:
    with db.write() as session:
        for _ in range(20):
            append_event(session, "bench.write", data={"n": n, "pad": "x" * 2000})
            n += 1
"""


def test_backup_while_another_process_writes(cli, upgraded, tmp_path):
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, f"sqlite:///{upgraded}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        targets = []
        for number in range(3):
            target = tmp_path / f"backup-{number}.db"
            result = cli("--json", "db", "backup", "--to", str(target))
            assert result.exit_code == 0, result
            assert result.json()["bytes"] == target.stat().st_size
            targets.append(target)
            time.sleep(0.2)
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
    counts = []
    for target in targets:
        assert stat.S_IMODE(target.stat().st_mode) == 0o600
        conn = sqlite3.connect(target)
        assert conn.execute("pragma integrity_check").fetchone() == ("ok",)
        # Transactions are whole: 20 events per commit, never a torn one.
        count = conn.execute("select count(*) from events").fetchone()[0]
        assert count % 20 == 0
        counts.append(count)
        conn.close()
    assert counts[-1] > counts[0] > 0, counts
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_backup_refuses_an_existing_target(cli, upgraded, tmp_path):
    target = tmp_path / "b.db"
    assert cli("db", "backup", "--to", str(target)).exit_code == 0
    before = target.read_bytes()
    again = cli("--json", "db", "backup", "--to", str(target))
    assert again.exit_code == 2, again
    assert "already exists" in again.json()["error"]["message"]
    assert target.read_bytes() == before


@pytest.mark.parametrize(
    ("target", "message"),
    [("relative.db", "must be an absolute path"), ("/nonexistent-dir/x.db", "does not exist")],
)
def test_backup_refuses_bad_targets(cli, upgraded, tmp_path, monkeypatch, target, message):
    monkeypatch.chdir(tmp_path)
    result = cli("db", "backup", "--to", target)
    assert result.exit_code == 2, result
    assert message in result.stderr
    assert not (tmp_path / "relative.db").exists()
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".db", ".tmp")]


def test_backup_without_database_is_refused(cli, tmp_path):
    result = cli("db", "backup", "--to", str(tmp_path / "b.db"))
    assert result.exit_code == 2, result
    assert "db upgrade" in result.stderr
    assert not (tmp_path / "b.db").exists()


def test_backup_targets_it_cannot_make_are_refused_and_leave_nothing(cli, upgraded, tmp_path):
    (tmp_path / "out").mkdir()
    same = tmp_path / "out" / "pair"
    refused = cli("--json", "db", "backup", "--to", str(same), "--with-artifacts", str(same))
    assert refused.exit_code == 2, refused
    assert refused.json()["error"]["message"] == (
        "--to and --with-artifacts name the same path; name two"
    )
    assert list((tmp_path / "out").iterdir()) == []
    proc = cli("--json", "db", "backup", "--to", "/proc/aiworker-backup.db")
    assert proc.exit_code == 2, proc
    assert proc.json()["error"]["message"].startswith(
        "backup target /proc/aiworker-backup.db cannot be created"
    )


def test_a_backup_stopped_by_sigterm_says_so_and_leaves_nothing(upgraded, tmp_path):
    """SIGTERM (systemd stopping the unit, an operator) arrives while the snapshot is
    being copied: the command removes its temporary file, prints one JSON error and
    exits 143; the live store is untouched."""
    target = tmp_path / "out" / "b.db"
    target.parent.mkdir()
    stopped = run_process(
        "--json",
        "db",
        "backup",
        "--to",
        str(target),
        env={"AIWORKER_FAILPOINT": "backup.copying:term"},
    )
    assert stopped.exit_code == 143, stopped
    assert stopped.json()["error"] == {"code": "interrupted", "message": "stopped by SIGTERM"}
    assert list(target.parent.iterdir()) == []
    check = sqlite3.connect(upgraded)
    assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    check.close()
    assert run_process("db", "backup", "--to", str(target)).exit_code == 0  # nothing in the way


def test_what_a_killed_backup_left_is_removed_by_the_next_backup_there(upgraded, tmp_path):
    """SIGKILL leaves the half-copied snapshot (as large as the store) in the backups'
    folder, which nothing else cleans: the next backup into that folder removes it, and
    only what a process that no longer runs left there."""
    out = tmp_path / "out"
    out.mkdir()
    killed = run_process(
        "db", "backup", "--to", str(out / "a.db"), env={"AIWORKER_FAILPOINT": "backup.copying"}
    )
    assert killed.exit_code == -9, killed
    [left] = [p.name for p in out.iterdir()]
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())
    assert left.startswith(f".a.db.{host}-pid")
    assert left.endswith(".tmp")
    kept = [
        out / f".c.db.{host}-pid{os.getpid()}.x1y2.tmp",  # a live process's
        out / ".d.db.elsewhere-pid999999.x1y2.tmp",  # another host's, in a shared folder
        out / ".notes.tmp",  # not a backup's at all
    ]
    for path in kept:
        path.write_text("in use")
    assert run_process("db", "backup", "--to", str(out / "b.db")).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(["b.db", *(p.name for p in kept)])


def logged_clients(folder, log) -> str:
    """A PATH whose pg_dump and pg_restore log their command lines, then run the real ones
    (another user on the host reads a command line in /proc)."""
    folder.mkdir()
    for name in ("pg_dump", "pg_restore"):
        real = shutil.which(name)
        assert real is not None
        wrapper = folder / name
        wrapper.write_text(f'#!/bin/sh\nprintf \'%s\\n\' "$*" >> {log}\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    return f"{folder}:{os.environ['PATH']}"


@pytest.mark.parametrize("form", ["user:password@", "?password="])
def test_postgresql_backup_is_a_checked_dump_of_a_database_being_written(
    cli, postgres, postgres_url, tmp_path, monkeypatch, form
):
    """pg_dump's custom format while another process commits: whole transactions only,
    checked by pg_restore, private, and the password (in either place a URL carries it)
    neither in what the command prints nor on pg_dump's command line."""
    if form == "?password=":
        postgres_url = postgres_url.replace(f":{postgres.password}@", "@")
        postgres_url += f"?password={postgres.password}"
    configure_database(postgres_url, tmp_path / "pg.toml", monkeypatch)
    commands = tmp_path / "commands.log"
    monkeypatch.setenv("PATH", logged_clients(tmp_path / "clients", commands))
    assert cli("db", "upgrade").exit_code == 0
    writer = subprocess.Popen([sys.executable, "-c", WRITER, postgres_url], stdout=subprocess.PIPE)
    try:
        assert writer.stdout.readline().strip() == b"ready"
        time.sleep(0.5)
        target = tmp_path / "store.dump"
        result = run_process("--json", "-v", "db", "backup", "--to", str(target))
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
    assert result.exit_code == 0, result
    assert result.json()["bytes"] == target.stat().st_size
    assert result.json()["source"].startswith(f"PostgreSQL at 127.0.0.1:{postgres.port}/")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert target.read_bytes()[:5] == b"PGDMP"
    assert postgres.password not in result.output
    lines = commands.read_text()
    assert "--dbname=postgresql://" in lines
    assert postgres.password not in lines
    # Restored into a new database, it holds whole transactions: 20 events per commit.
    restored = postgres.create_database()
    subprocess.run(
        [str(BIN / "pg_restore"), "-h", postgres.host, "-p", str(postgres.port), "-U",
         postgres.user, "-d", restored, "--no-owner", str(target)],
        env={**os.environ, "PGPASSWORD": postgres.password}, check=True, timeout=60,
    )  # fmt: skip
    [(count,)] = rows(postgres.url(restored), "select count(*) from events")
    assert count > 0
    assert count % 20 == 0, count
    again = cli("db", "backup", "--to", str(target))
    assert again.exit_code == 2
    assert "already exists" in again.stderr


def test_postgresql_backup_of_a_stopped_server_fails_and_keeps_nothing(
    cli, postgres_url, tmp_path, monkeypatch
):
    configure_database(postgres_url.replace(postgres_url.split(":")[3].split("/")[0], "1"),
                       tmp_path / "pg.toml", monkeypatch)  # fmt: skip
    result = cli("db", "backup", "--to", str(tmp_path / "store.dump"))
    assert result.exit_code == 75, result
    assert "PostgreSQL at 127.0.0.1:1/" in result.stderr
    assert "refuses connections" in result.stderr
    assert list(tmp_path.glob("*dump*")) == []


def test_a_still_copy_during_which_the_database_changed_is_refused(upgraded, tmp_path, monkeypatch):
    """The read-only mount a backup sees may be another mount of a disk a controller still
    writes: a commit landing while the files are copied makes them two states, and the
    copy is refused, leaving nothing (here the commit is made right after the database
    file is copied, through a connection of its own)."""
    from aiworker.errors import InvalidInput
    from aiworker.store import backup

    writer = sqlite3.connect(upgraded, isolation_level=None)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("INSERT INTO events (kind, data, created_at) VALUES ('a', '{}', 0)")
    copy = shutil.copyfile

    def copy_then_commit(source, target):
        copied = copy(source, target)
        writer.execute("INSERT INTO events (kind, data, created_at) VALUES ('b', '{}', 0)")
        return copied

    monkeypatch.setattr(backup.shutil, "copyfile", copy_then_commit)
    target = tmp_path / "out" / "backup.db"
    target.parent.mkdir()
    try:
        with pytest.raises(InvalidInput, match="changed while it was copied"):
            backup.backup_still_sqlite(upgraded, target)
    finally:
        writer.close()
    assert list(target.parent.iterdir()) == []
