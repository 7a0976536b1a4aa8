"""db backup: a consistent, private snapshot of a database other processes write to."""

from __future__ import annotations

import sqlite3
import stat
import subprocess
import sys
import time

import pytest

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
