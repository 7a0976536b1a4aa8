"""`db copy --to URL`: moving an installation's store from SQLite to PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import time

from aiworker.store.attempts import start_attempt
from aiworker.store.engine import Database
from aiworker.store.schema import upgrade
from aiworker.store.tables import metadata
from aiworker.store.task_records import create_task, ensure_repository
from tests.pg_fixtures import configure_database, rows

NUL_REASON = "the job's log ended: \x00\x00 (binary)"


def seed(url: str) -> dict[str, int]:
    """A plan with two milestones, issues, an attempt that ended: rows in most tables."""
    db = Database(url)
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        plan = create_task(session, repo.id, "plan", issue_number=1, state="milestones")
        for _ in range(2):
            create_task(session, repo.id, "milestone", parent_id=plan.id)
        for number in range(2, 40):
            create_task(session, repo.id, "issue", issue_number=number, title="ü " * 50)
        attempt = start_attempt(session, plan.id, "planning", "script", None, None, {"a": [1]})
    from aiworker.store.attempts import finish_attempt

    with db.write() as session:
        # A NUL (a dead job's binary log tail): SQLite keeps it, PostgreSQL's text refuses it.
        finish_attempt(session, attempt, "succeeded", reason=NUL_REASON)
    db.dispose()
    return {"plan": plan.id}


def table_counts(url: str) -> dict[str, int]:
    return {
        t.name: rows(url, f"select count(*) from {t.name}")[0][0] for t in metadata.sorted_tables
    }


def test_a_sqlite_store_moves_to_postgresql_whole(
    cli, upgraded, postgres_url, tmp_path, monkeypatch
):
    sqlite_url = f"sqlite:///{upgraded}"
    seed(sqlite_url)
    before = cli("--json", "status").json()["tasks"]
    result = cli("--json", "db", "copy", "--to", postgres_url)
    assert result.exit_code == 0, result
    password = postgres_url.split(":")[2].split("@")[0]
    assert password not in result.output
    assert result.json()["rows"]["tasks"] == 41
    assert table_counts(postgres_url) == table_counts(sqlite_url)
    assert rows(postgres_url, "select title from tasks where issue_number = 9") == [("ü " * 50,)]
    assert rows(postgres_url, "select reason from attempts") == [
        (NUL_REASON.replace("\x00", "\ufffd"),)
    ]
    # The copy is the installation now: the same tasks, and new rows continue the ids.
    configure_database(postgres_url, tmp_path / "pg.toml", monkeypatch)
    assert cli("--json", "status").json()["tasks"] == before
    db = Database(postgres_url)
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        assert create_task(session, repo.id, "issue", issue_number=99).id == 42
    db.dispose()


def test_a_copy_refuses_a_database_in_use_or_running_work(cli, upgraded, postgres_url, tmp_path):
    seed(f"sqlite:///{upgraded}")
    assert cli("db", "copy", "--to", postgres_url).exit_code == 0
    again = cli("db", "copy", "--to", postgres_url)
    assert again.exit_code == 2
    assert "is not empty" in again.stderr
    bad = cli("db", "copy", "--to", "mysql://somewhere/db")
    assert bad.exit_code == 2
    assert "--to: must be" in bad.stderr
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        start_attempt(session, 1, "planning", "script", None, None, {})
    db.dispose()
    busy = cli("db", "copy", "--to", f"sqlite:///{tmp_path / 'other.db'}")
    assert busy.exit_code == 75
    assert "work is running" in busy.stderr
    assert not (tmp_path / "other.db").exists()  # refused before anything was written


def test_a_copy_writes_nothing_to_a_target_it_refuses(cli, upgraded, postgres, tmp_path):
    """Another installation's older database, or another application's, is refused before
    anything is written to it: not migrated, no table added."""
    seed(f"sqlite:///{upgraded}")
    older = postgres.url(postgres.create_database())
    db = Database(older)
    upgrade(db)
    db.dispose()
    rows(older, "update alembic_version set version_num = '0005_artifacts'")
    refused = cli("db", "copy", "--to", older)
    assert refused.exit_code == 2, refused
    assert "at revision 0005_artifacts" in refused.stderr
    assert rows(older, "select version_num from alembic_version") == [("0005_artifacts",)]
    theirs = postgres.url(postgres.create_database())
    rows(theirs, "create table tasks (x integer)")
    refused = cli("db", "copy", "--to", theirs)
    assert refused.exit_code == 2, refused
    assert "tables of another application: tasks" in refused.stderr
    listed = rows(theirs, "select tablename from pg_tables where schemaname = 'public'")
    assert listed == [("tasks",)]


def test_a_sqlite_target_it_refuses_is_left_byte_for_byte(cli, upgraded, tmp_path):
    """A SQLite file of another application is read read-only: refused, it keeps its
    bytes and its journal mode (opening it for writing would have switched it to WAL)."""
    seed(f"sqlite:///{upgraded}")
    theirs = tmp_path / "theirs.db"
    connection = sqlite3.connect(theirs)
    connection.execute("CREATE TABLE foo (x INTEGER)")
    connection.execute("INSERT INTO foo VALUES (1)")
    connection.commit()
    connection.close()
    before = hashlib.sha256(theirs.read_bytes()).hexdigest()
    refused = cli("db", "copy", "--to", f"sqlite:///{theirs}")
    assert refused.exit_code == 2, refused
    assert "tables of another application: foo" in refused.stderr
    assert hashlib.sha256(theirs.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("theirs")) == [
        "theirs.db"
    ]


def test_a_sqlite_target_that_keeps_nothing_or_is_no_file_is_refused(cli, upgraded, tmp_path):
    seed(f"sqlite:///{upgraded}")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a database, " * 100)
    for url, said in (
        ("sqlite:///:memory:", "--to: a SQLite URL names its file by an absolute path"),
        (f"sqlite:///{tmp_path / 'x?mode=rw'}", "--to must name a SQLite file"),
        (f"sqlite+pysqlite:///{tmp_path / 'x?mode=rw'}", "--to must name a SQLite file"),
        (f"sqlite:///{folder}", f"--to {folder}: not a file"),
        (f"sqlite:///{folder / 'notes.txt'}", "--to is not empty (a file that is not a SQLite"),
    ):
        refused = cli("--json", "db", "copy", "--to", url)
        assert refused.exit_code == 2, (url, refused)
        assert refused.json()["error"]["message"].startswith(said), url
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "state"]
    copied = tmp_path / "new" / "copy.db"
    assert cli("db", "copy", "--to", f"sqlite:///{copied}").exit_code == 0
    assert copied.stat().st_mode & 0o777 == 0o600
    spelled = tmp_path / "new" / "spelled.db"  # the driver named: a SQLite file all the same
    assert cli("db", "copy", "--to", f"sqlite+pysqlite:///{spelled}").exit_code == 0
    assert spelled.stat().st_mode & 0o777 == 0o600


def test_a_postgresql_store_copies_back_to_sqlite_from_one_snapshot(
    cli, postgres_url, tmp_path, monkeypatch
):
    """The way back, PostgreSQL to SQLite (its source read in one read-only snapshot):
    every row arrives, and a reason that held a NUL arrives as PostgreSQL stored it."""
    configure_database(postgres_url, tmp_path / "pg.toml", monkeypatch)
    assert cli("db", "upgrade").exit_code == 0
    seed(postgres_url)
    back = f"sqlite:///{tmp_path / 'back.db'}"
    result = cli("--json", "db", "copy", "--to", back)
    assert result.exit_code == 0, result
    assert table_counts(back) == table_counts(postgres_url)
    assert rows(back, "select reason from attempts") == [(NUL_REASON.replace("\x00", "\ufffd"),)]


def test_a_copy_waits_for_a_running_tick_and_copies_what_it_recorded(
    cli, upgraded, fake, tmp_path, monkeypatch
):
    """A tick that began before the copy holds maintenance.lock shared until it ends: the
    copy waits for it, so nothing the tick records is left behind in the old store."""
    trickled = json.dumps({"message": "slow"}).encode()
    script, url = fake(("trickle", 401, trickled, {}))  # about 4 s for the tick's first call
    monkeypatch.setenv("AIWORKER_TEST_TOKEN", "t0ken-for-the-fake")
    config = tmp_path / "config.toml"
    identity = 'token_env = "AIWORKER_TEST_TOKEN"'
    config.write_text(
        f'[forge]\nurl = "{url}"\n'
        + "".join(f"[forge.identities.{r}]\n{identity}\n" for r in ("planner", "worker"))
        + '[[repositories]]\nindex = 1\nowner = "team"\nname = "app"\n'
    )
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))
    tick = subprocess.Popen(
        [sys.executable, "-m", "aiworker", "--json", "scheduler", "tick"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not script.seen:  # the tick is polling: it holds the lock
            assert tick.poll() is None, tick.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        copied = tmp_path / "copy.db"
        result = cli("db", "copy", "--to", f"sqlite:///{copied}")
        ended = tick.poll()
    finally:
        out, err = tick.communicate(timeout=60)
    assert result.exit_code == 0, result
    assert ended is not None, "the copy ran while the tick was still running"
    # Its poll met a 401 (the operator must act): the tick did the rest, then exits 2.
    assert tick.returncode == 2, (out, err)
    assert "401" in json.loads(out)["poll_error"]
    checks = f"sqlite:///{copied}", "select count(*) from events where kind = 'scheduler.check'"
    assert rows(*checks) == rows(f"sqlite:///{upgraded}", checks[1]) == [(1,)]


def test_a_copy_refuses_while_a_started_job_has_not_recorded_its_attempt(
    cli, upgraded, state_dir, hold_in_child, tmp_path
):
    """A job the tick started holds its slot's (or its task's) lock before it records an
    attempt: that is work running too."""
    seed(f"sqlite:///{upgraded}")
    for name, said in (("slot-2", "slot 2"), ("task-7", "task 7")):
        child = hold_in_child(state_dir, name)
        busy = cli("db", "copy", "--to", f"sqlite:///{tmp_path / 'other.db'}")
        assert busy.exit_code == 75, busy
        assert f"work is running ({said})" in busy.stderr
        assert not (tmp_path / "other.db").exists()
        child.kill()
        child.wait()
    assert cli("db", "copy", "--to", f"sqlite:///{tmp_path / 'other.db'}").exit_code == 0
