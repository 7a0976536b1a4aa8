"""The store: migrations, connection pragmas, fail-closed schema checks, compare-and-update.

Tests that take `store_url` run on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import insert, select, text
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

from aiworker.config.loader import load_config
from aiworker.core.context import Environment
from aiworker.core.tasks.lifecycle import TransitionRefused, advance
from aiworker.store import models, tables
from aiworker.store.attempts import start_attempt
from aiworker.store.claims import claim_next
from aiworker.store.driver import DriverConnection, DriverStatement
from aiworker.store.engine import Database
from aiworker.store.models import Base, Event, Task
from aiworker.store.postgresql import WRITE_LOCK_KEY
from aiworker.store.schema import HEAD_REVISION, KNOWN_REVISIONS, migrations_dir
from aiworker.store.task_records import create_task, ensure_repository
from aiworker.store.tasks import claim, compare_and_update
from tests.helpers import run_process
from tests.pg_fixtures import configure_database, rows, start_server


def sqlite_cli(db: Path, sql: str) -> str:
    return subprocess.run(
        ["sqlite3", str(db), sql], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_upgrade_creates_a_wal_database(cli, state_dir):
    result = cli("--json", "db", "upgrade")
    assert result.exit_code == 0, result
    assert result.json()["before"] is None
    assert result.json()["current"] == HEAD_REVISION
    db = state_dir / "aiworker.db"
    assert sqlite_cli(db, "pragma journal_mode") == "wal"
    assert (state_dir.stat().st_mode & 0o777) == 0o700


def test_upgrade_rerun_is_a_noop(cli, upgraded):
    before = sqlite_cli(upgraded, "select group_concat(name) from sqlite_master")
    result = cli("--json", "db", "upgrade")
    assert result.exit_code == 0, result
    assert result.json()["before"] == result.json()["current"] == HEAD_REVISION
    assert sqlite_cli(upgraded, "select group_concat(name) from sqlite_master") == before


def test_known_revisions_match_the_migration_scripts():
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    scripts = ScriptDirectory.from_config(config)
    ordered = [rev.revision for rev in reversed(list(scripts.walk_revisions()))]
    assert tuple(ordered) == KNOWN_REVISIONS
    assert scripts.get_current_head() == HEAD_REVISION


def test_models_match_migrated_schema(store_url):
    db = Database(store_url)
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    db.dispose()
    assert diff == []


def test_worker_jobs_left_open_by_steps_that_died_before_the_upgrade_end_with_it(cli, store_url):
    """A fleet job queued or leased by a step of the old version that died (a reboot)
    has no waiter left, and none the new schema could record: the upgrade to 0010 ends
    it failed, saying so, so that no runner runs it for nobody; a finished job stays."""
    from aiworker.store.worker_jobs import claim, enqueue, finish

    db = Database(store_url)
    done, leased, queued = (enqueue(db, 1, {"n": n}) for n in range(3))
    for index, key in ((done, "a"), (leased, "b")):
        lease = claim(db, "r1", key, lease_for=timedelta(minutes=5), max_attempts=3)
        assert lease.worker_job_index == index
    finish(db, (1, done), lease_token(db, done), "succeeded", {"ok": True})
    with db.transaction() as connection:
        connection.exec_driver_sql(
            "UPDATE alembic_version SET version_num = '0009_mend_edited_migrations'"
        )
    db.dispose()
    assert cli("db", "upgrade").exit_code == 0
    ended = rows(store_url, "select worker_job_index, state, result from worker_jobs")
    by_index = {index: (state, str(result)) for index, state, result in ended}
    assert by_index[done][0] == "succeeded"
    for index in (leased, queued):
        state, result = by_index[index]
        assert state == "failed"
        assert "its controller's step ended before the upgrade" in result


def lease_token(db, index):
    [(token,)] = rows(
        db.url, f"select lease_token from worker_jobs where worker_job_index = {index}"
    )
    return token


def test_a_store_that_edited_migrations_left_short_is_mended_by_upgrade(
    cli, store_url, tmp_path, monkeypatch
):
    """0006 and 0007 were edited after their first version ran: a store that first version
    migrated is stamped with their revision but lacks the change, and every command then
    failed on the missing column. The next upgrade adds what is missing."""
    if store_url.startswith("sqlite"):  # doctor reads the store a configuration names
        configure_database(store_url, tmp_path / "sqlite.toml", monkeypatch)
    db = Database(store_url)
    with db.transaction() as connection:
        connection.exec_driver_sql("ALTER TABLE controllers DROP COLUMN lease_s")
        if not db.sqlite:
            connection.exec_driver_sql(
                "ALTER TABLE provider_observations ALTER COLUMN source TYPE VARCHAR(64)"
            )
    # At the head's revision, doctor names what its tables lack.
    checks = {c["name"]: c for c in cli("--json", "doctor").json()["checks"]}
    assert checks["database"]["status"] == "fail"
    assert (
        "tables differ from this version's: no column controllers.lease_s"
        in (checks["database"]["detail"])
    )
    with db.transaction() as connection:
        connection.exec_driver_sql(
            "UPDATE alembic_version SET version_num = '0008_authorized_scope'"
        )
    db.dispose()
    assert cli("status").exit_code == 2  # older than this aiworker: upgrade first
    upgraded = cli("db", "upgrade")
    assert upgraded.exit_code == 0, upgraded
    db = Database(store_url)
    with db.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    db.dispose()
    assert cli("status").exit_code == 0
    db = Database(store_url)
    with db.transaction() as connection:  # another application's table beside ours
        connection.exec_driver_sql("CREATE TABLE spatial_ref_sys (srid INTEGER PRIMARY KEY)")
    db.dispose()
    checks = {c["name"]: c for c in cli("--json", "doctor").json()["checks"]}
    assert checks["database"]["status"] != "fail", checks["database"]
    assert cli("db", "upgrade").exit_code == 0  # and again: nothing more to do


def test_a_migration_waits_for_running_work_to_end(cli, upgraded):
    """A job of the old version running through a migration would write into the new
    schema: the upgrade refuses while an attempt is open (exit 75, nothing migrated), and
    migrates once the work ended."""
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        task = create_task(session, repo.id, "issue", issue_number=1, title="t")
        attempt = start_attempt(session, task.id, "implementation", "script", None, None, {})
    with db.transaction() as connection:
        connection.exec_driver_sql(
            "UPDATE alembic_version SET version_num = '0008_authorized_scope'"
        )
    (upgraded.parent / "controller-instance").unlink(missing_ok=True)
    assert cli("status").exit_code == 2  # older than this aiworker, and nothing written
    assert cli("db", "current").exit_code == 0  # readers of an old store write nothing
    assert cli("doctor").exit_code != 0
    assert not (upgraded.parent / "controller-instance").exists()
    refused = cli("--json", "db", "upgrade")
    assert refused.exit_code == 75, refused
    assert refused.json()["error"]["message"] == (
        f"work is running (attempt {attempt} of task {task.id}): pause the scheduler, let "
        "the jobs finish, then migrate"
    )
    assert sqlite_cli(upgraded, "select version_num from alembic_version") == (
        "0008_authorized_scope"
    )
    # Its job runs (a process of this host with its task's arguments): still refused.
    job = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "--task", str(task.id)]
    )
    try:
        _set_pid(db, attempt, job.pid)
        assert cli("db", "upgrade").exit_code == 75
    finally:
        job.kill()
        job.wait()
    # Its job died (killed, a reboot): nothing holds the work, and the old version's tick
    # that would have recovered it is gone, so the migration goes ahead; the new tick
    # recovers the attempt as any dead job's.
    _set_pid(db, attempt, job.pid)
    db.dispose()
    migrated = cli("db", "upgrade")
    assert migrated.exit_code == 0, migrated
    assert sqlite_cli(upgraded, "select version_num from alembic_version") == HEAD_REVISION
    assert cli("scheduler", "tick").exit_code in (0, 2)  # no forge here: its poll fails
    assert sqlite_cli(upgraded, f"select outcome from attempts where id = {attempt}") == (
        "abandoned"
    )


def _set_pid(db, attempt, pid):
    with db.transaction() as connection:
        connection.execute(
            text("UPDATE attempts SET pid = :pid WHERE id = :id"), {"pid": pid, "id": attempt}
        )


def test_every_connection_gets_the_pragmas(upgraded):
    db = Database(f"sqlite:///{upgraded}")
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("pragma busy_timeout").scalar() == 30000
        assert conn.exec_driver_sql("pragma synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("pragma foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("pragma journal_mode").scalar() == "wal"
    db.dispose()


def test_write_sessions_take_the_write_lock_at_begin(upgraded):
    db = Database(f"sqlite:///{upgraded}")
    other = sqlite3.connect(upgraded, timeout=0, isolation_level=None)
    with db.write() as session:
        session.execute(text("select 1"))
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
    other.execute("BEGIN IMMEDIATE")
    other.execute("ROLLBACK")
    other.close()
    db.dispose()


def test_postgresql_write_sessions_hold_the_write_lock_until_they_end(postgres_url):
    """What BEGIN IMMEDIATE is on SQLite: one writer at a time, here on any host."""
    store_url = postgres_url
    db = Database(store_url)
    probe = f"SELECT pg_try_advisory_xact_lock({WRITE_LOCK_KEY})"
    with db.write() as session:
        session.execute(text("select 1"))
        assert rows(store_url, probe) == [(False,)]
    with db.transaction() as connection:
        connection.execute(text("select 1"))
        assert rows(store_url, probe) == [(False,)]
    assert rows(store_url, probe) == [(True,)]
    with db.read() as session:  # readers take nothing
        session.execute(text("select 1"))
        assert rows(store_url, probe) == [(True,)]
    db.dispose()


@pytest.mark.parametrize(
    ("revision", "said"),
    [("9999_future", "is newer than this aiworker"), ("b7c1e2_theirs", "is not one this")],
)
def test_newer_or_foreign_schema_fails_closed(cli, store_url, revision, said):
    rows(store_url, f"update alembic_version set version_num = '{revision}'")
    for args in (("status",), ("db", "upgrade"), ("db", "current")):
        result = cli(*args)
        assert result.exit_code == 2, (args, result)
        assert revision in result.stderr
        assert said in " ".join(result.stderr.split())
        assert HEAD_REVISION in result.stderr
    assert rows(store_url, "select version_num from alembic_version") == [(revision,)]


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_uninitialised_database_is_refused(cli, engine, request, tmp_path, monkeypatch):
    if engine == "postgresql":
        url = request.getfixturevalue("postgres_url")
        configure_database(url, tmp_path / "postgresql.toml", monkeypatch)
    result = cli("--json", "status")
    assert result.exit_code == 2, result
    assert result.json()["error"]["code"] == "schema_mismatch"
    assert "db upgrade" in result.json()["error"]["message"]


def test_foreign_keys_are_enforced(store_url):
    db = Database(store_url)
    with pytest.raises(Exception, match=r"(?i)foreign key"), db.write() as session:
        create_task(session, repository_id=999, kind="issue", issue_number=1)
    db.dispose()


def test_compare_and_update_refuses_a_stale_version(store_url):
    db = Database(store_url)
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        task = create_task(session, repo.id, "issue", issue_number=7, title="fix it")
        task_id, version = task.id, task.version
    with db.write() as session:
        assert advance(session, task_id, "ready", version, "paused", "test", actor="test") == 2
    # A writer that read version 1 is now stale: nothing changes, and it is told why.
    with pytest.raises(TransitionRefused) as refused, db.write() as session:
        advance(session, task_id, "ready", version, "claimed", "stale", actor="stale")
    assert refused.value.message == (
        f"task {task_id} is paused at version 2, not ready at version 1; ready -> claimed refused"
    )
    with db.read() as session:
        task = session.get(Task, task_id)
        assert (task.state, task.version) == ("paused", 2)
        kinds = session.scalars(select(Event.kind).where(Event.task_id == task_id)).all()
        assert kinds == ["task.created", "task.paused"]  # a pause is recorded as one
    db.dispose()


def test_claim_records_slot_holder_and_event(store_url):
    db = Database(store_url)
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        task = create_task(session, repo.id, "issue", issue_number=8)
    with db.write() as session:
        assert claim(session, task.id, task.version, slot=2, holder_token="holder-a")
    with db.write() as session:
        assert not claim(session, task.id, task.version, slot=3, holder_token="holder-b")
    with db.read() as session:
        stored = session.get(Task, task.id)
        assert (stored.state, stored.claim_slot, stored.claim_token) == ("claimed", 2, "holder-a")
        assert stored.claimed_at is not None
        assert stored.claimed_at.tzinfo is not None
        event = session.scalars(select(Event).where(Event.kind == "task.claimed")).one()
        assert event.data == {"slot": 2, "holder": "holder-a"}
    db.dispose()


def seed_plan(db: Database) -> dict[str, int]:
    """A plan with two milestones, an older issue task and a newer feature task."""
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        ids = {"issue": create_task(session, repo.id, "issue", issue_number=1).id}
        plan = create_task(session, repo.id, "plan", issue_number=2, state="milestones")
        ids["plan"] = plan.id
        for name in ("m1", "m2"):
            ids[name] = create_task(session, repo.id, "milestone", parent_id=plan.id).id
        ids["feature"] = create_task(session, repo.id, "feature", issue_number=5).id
    return ids


def test_claim_next_takes_the_oldest_task_of_the_given_kinds(store_url):
    db = Database(store_url)
    ids = seed_plan(db)
    assert claim_next(db, 1, "h1", ["feature"]) == ids["feature"]
    assert claim_next(db, 2, "h2", ["feature", "issue"]) == ids["issue"]
    assert claim_next(db, 3, "h3", ["feature", "issue"]) is None
    assert claim_next(db, 3, "h3", []) is None
    with db.read() as session:
        claimed = {
            t.id: (t.state, t.claim_slot, t.claim_token)
            for t in session.scalars(select(Task).where(Task.state == "claimed"))
        }
        events = session.scalars(select(Event).where(Event.kind == "task.claimed")).all()
    assert claimed == {ids["feature"]: ("claimed", 1, "h1"), ids["issue"]: ("claimed", 2, "h2")}
    assert sorted((e.task_id, e.actor, e.data["holder"]) for e in events) == sorted(
        [(ids["feature"], "slot-1", "h1"), (ids["issue"], "slot-2", "h2")]
    )
    db.dispose()


def test_a_plan_advances_one_milestone_at_a_time(store_url):
    db = Database(store_url)
    ids = seed_plan(db)
    # Nothing of a plan that does not run its milestones (awaiting approval again) starts.
    for state in ("awaiting_plan_approval", "milestones"):
        with db.write() as session:
            plan = session.get(Task, ids["plan"])
            assert compare_and_update(session, plan.id, plan.version, plan.state, state)
        if state != "milestones":
            assert claim_next(db, 1, "h1", ["milestone"]) is None
    assert claim_next(db, 1, "h1", ["milestone"]) == ids["m1"]
    # m1 is in flight: its sibling waits, whichever state of flight m1 is in.
    for state in ("running", "awaiting_ci", "awaiting_review"):
        with db.write() as session:
            current = session.get(Task, ids["m1"])
            assert compare_and_update(session, current.id, current.version, current.state, state)
        assert claim_next(db, 2, "h2", ["milestone"]) is None
    with db.write() as session:
        current = session.get(Task, ids["m1"])
        assert compare_and_update(session, current.id, current.version, current.state, "done")
    assert claim_next(db, 2, "h2", ["milestone"]) == ids["m2"]
    db.dispose()


def test_claim_next_refuses_unknown_kinds(store_url):
    db = Database(store_url)
    seed_plan(db)
    with pytest.raises(ValueError, match="unknown task kinds"):
        claim_next(db, 1, "h1", ["bugfix"])
    with db.read() as session:
        assert session.scalars(select(Task).where(Task.state == "claimed")).all() == []
    db.dispose()


def test_driver_statements_store_what_sqlalchemy_reads_back(store_url):
    """Values bound on the driver go through SQLAlchemy's own processors: JSON and UTC time
    read back through the ORM exactly as written."""
    db = Database(store_url)
    written = datetime(2026, 11, 30, 3, 4, 5, 0, tzinfo=UTC)  # no microseconds: no shortcut
    statement = DriverStatement(
        insert(tables.events),
        column_keys=["kind", "data", "created_at", "task_id", "from_state", "to_state", "actor"],
    )
    with db.driver_transaction() as connection:
        statement.execute(
            connection,
            {
                "kind": "probe",
                "data": {"nested": [1, "two", None], "ü": True},
                "created_at": written,
                "task_id": None,
                "from_state": None,
                "to_state": None,
                "actor": None,
            },
        )
    with db.read() as session:
        event = session.scalars(select(Event).where(Event.kind == "probe")).one()
    assert event.data == {"nested": [1, "two", None], "ü": True}
    assert event.created_at == written
    with pytest.raises(KeyError, match="no value for parameter"):  # noqa: SIM117
        with db.driver_transaction() as connection:
            statement.execute(connection, {"data": {}})
    in_list = select(tables.tasks.c.id).where(tables.tasks.c.state.in_(["ready", "new"]))
    with pytest.raises(ValueError, match="IN lists"):
        DriverStatement(in_list).prepare(db.engine.dialect)
    db.dispose()


def test_orm_attribute_types_match_the_tables():
    """models.py declares each mapped attribute's type for the type checker only; the tables
    are the schema. Every column must be declared, optional exactly when nullable."""
    source = (Path(models.__file__)).read_text()
    declared: dict[str, dict[str, str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name != "Base":
            guarded = [n for n in node.body if isinstance(n, ast.If)]
            declared[node.name] = {
                item.target.id: ast.unparse(item.annotation)
                for block in guarded
                for item in block.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
    assert declared, "no mapped classes found"
    for name, typed in declared.items():
        table = getattr(models, name).__table__
        assert set(typed) == {c.name for c in table.columns}, name
        for column in table.columns:
            optional = typed[column.name].endswith("| None]")
            assert optional == column.nullable, f"{name}.{column.name}"


def test_driver_statements_bind_by_name_where_the_driver_wants_names(upgraded):
    """Drivers with named parameters (PostgreSQL's) get a mapping, not a list: run the same
    statement on SQLite through its named paramstyle, next to the positional one."""
    statement = DriverStatement(insert(tables.events), column_keys=["kind", "data", "created_at"])
    at = datetime(2026, 11, 30, 4, 0, 0, 123456, tzinfo=UTC)
    raw = sqlite3.connect(upgraded, isolation_level=None)
    try:
        for dialect in (sqlite_dialect(paramstyle="named"), sqlite_dialect()):
            raw.execute("BEGIN IMMEDIATE")
            statement.execute(
                DriverConnection(raw, dialect),
                {"kind": f"probe-{dialect.paramstyle}", "data": {"n": 1}, "created_at": at},
            )
            raw.execute("COMMIT")
    finally:
        raw.close()
    db = Database(f"sqlite:///{upgraded}")
    with db.read() as session:
        events = session.scalars(select(Event).where(Event.kind.like("probe-%"))).all()
    db.dispose()
    assert sorted((e.kind, e.data, e.created_at) for e in events) == [
        ("probe-named", {"n": 1}, at),
        ("probe-qmark", {"n": 1}, at),
    ]
    # A statement with its own literals (state, limit) binds them by name as well.
    oldest = DriverStatement(
        select(tables.events.c.kind)
        .where(tables.events.c.kind == "probe-named")
        .order_by(tables.events.c.id)
        .limit(1)
    )
    raw = sqlite3.connect(upgraded, isolation_level=None)
    try:
        named = DriverConnection(raw, sqlite_dialect(paramstyle="named"))
        assert oldest.execute(named, {}).fetchall() == [("probe-named",)]
    finally:
        raw.close()


def test_two_hosts_upgrading_one_postgresql_database_take_turns(postgres_url, tmp_path):
    """Two `db upgrade` processes start together on an empty database: one migrates, the
    other waits for it and finds the schema at head."""
    config = tmp_path / "pg.toml"
    config.write_text(f'[database]\nurl = "{postgres_url}"\n')
    env = {**os.environ, "AIWORKER_CONFIG": str(config)}
    argv = [sys.executable, "-m", "aiworker", "--json", "--state-dir"]
    upgrades = [
        subprocess.Popen(
            [*argv, str(tmp_path / f"host{n}"), "db", "upgrade"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (1, 2)
    ]
    reports = []
    for upgrade in upgrades:
        out, err = upgrade.communicate(timeout=120)
        assert upgrade.returncode == 0, err
        reports.append(json.loads(out))
    assert sorted((r["before"] or "", r["current"]) for r in reports) == [
        ("", HEAD_REVISION),
        (HEAD_REVISION, HEAD_REVISION),
    ]
    assert rows(postgres_url, "select version_num from alembic_version") == [(HEAD_REVISION,)]


def test_a_readings_source_of_any_length_is_stored(store_url):
    """A script provider's source names its scenario's path, longer than 64 characters in
    a deep directory: PostgreSQL refuses what exceeds a VARCHAR, SQLite never did."""
    from aiworker.store.observations import record_observation

    db = Database(store_url)
    source = "scenario /" + "deep/" * 40 + "scenario.json"
    with db.write() as session:
        record_observation(
            session,
            provider="script",
            window="run",
            used_percent=None,
            resets_at=None,
            valid=True,
            source=source,
            reason="",
        )
    assert rows(store_url, "select source from provider_observations") == [(source,)]
    db.dispose()


def test_a_role_that_may_not_create_tables_is_told_what_to_do(cli, postgres, tmp_path, monkeypatch):
    """PostgreSQL 15 lets only a database's owner create in its schema public: a database
    another role owns is refused with the fix (exit 2), not an unexplained driver error."""
    name = f"t_{os.urandom(6).hex()}"
    postgres.psql(f"CREATE DATABASE {name}")  # owned by postgres, not by the URL's role
    configure_database(postgres.url(name), tmp_path / "pg.toml", monkeypatch)
    result = cli("--json", "db", "upgrade")
    assert result.exit_code == 2, result
    message = result.json()["error"]["message"]
    assert message.startswith(f"PostgreSQL at 127.0.0.1:{postgres.port}/{name} does not let")
    assert "make the role the database's owner" in message
    assert postgres.password not in result.output


def test_a_server_that_refuses_for_a_while_or_an_option_is_named(
    cli, postgres, monkeypatch, tmp_path
):
    """No free connection and a read-only server are waits (exit 75, what a timer's unit
    counts as success); an option the driver does not know is the URL's fault (exit 2)."""
    name = postgres.create_database()
    url = postgres.url(name)
    configure_database(url, tmp_path / "pg.toml", monkeypatch)
    assert cli("db", "upgrade").exit_code == 0
    where = f"PostgreSQL at 127.0.0.1:{postgres.port}/{name}"

    def tick_while(setting: str, usual: str):
        postgres.psql(setting)
        try:
            return cli("--json", "scheduler", "tick")
        finally:
            postgres.psql(usual)

    role, database = f"ALTER ROLE {postgres.user}", f"ALTER DATABASE {name} SET"
    full = tick_while(f"{role} CONNECTION LIMIT 0", f"{role} CONNECTION LIMIT -1")
    assert full.exit_code == 75, full
    assert full.json()["error"]["message"] == f"{where} has no free connection; try again"
    readonly = "default_transaction_read_only"
    standby = tick_while(f"{database} {readonly} = on", f"{database} {readonly} = off")
    assert standby.exit_code == 75, standby
    assert standby.json()["error"]["message"].startswith(f"{where} accepts no writes")
    configure_database(f"{url}?sslmod=require", tmp_path / "typo.toml", monkeypatch)
    for args in (("db", "current"), ("scheduler", "tick"), ("db", "upgrade")):
        typo = cli("--json", *args)
        assert typo.exit_code == 2, (args, typo)
        message = typo.json()["error"]["message"]
        assert message == f"{where} cannot take an option database.url names", (args, message)
    for result in (full, standby, typo):
        assert postgres.password not in result.output


def test_a_job_started_while_the_server_is_down_waits_for_it(tmp_path, monkeypatch):
    """The tick launched a job just as PostgreSQL went down for a restart: the job waits
    for the server from its first look (its own store's check; a systemd unit's read of
    its task) instead of failing at once, which its next recovery would charge as a job
    that died."""
    server = start_server()
    jobs = []
    try:
        name = server.create_database()
        configure_database(server.url(name), tmp_path / "pg.toml", monkeypatch)
        assert run_process("db", "upgrade").exit_code == 0
        server.stop()
        for argv in (("publish", "--task", "7"), ("scheduler", "run-step", "7")):
            err = tmp_path / f"{argv[0]}.err"
            with err.open("w") as stream:
                command = [sys.executable, "-m", "aiworker", "--json", *argv]
                jobs.append(
                    (
                        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stream, text=True),
                        err,
                    )
                )
        deadline = time.monotonic() + 120
        while not all("waiting for it" in err.read_text() for _, err in jobs):
            assert time.monotonic() < deadline, [err.read_text() for _, err in jobs]
            assert all(job.poll() is None for job, _ in jobs)
            time.sleep(0.1)
        server.start()
        outs = [job.communicate(timeout=120)[0] for job, _ in jobs]
    finally:
        for job, _ in jobs:
            job.kill()
            job.communicate()
        with contextlib.suppress(subprocess.CalledProcessError):  # stopped already
            server.stop("immediate")
        shutil.rmtree(server.folder, ignore_errors=True)
    # Each went on once the server was back: to the task, which does not exist here.
    said = [json.loads(out)["error"]["message"] for out in outs]
    assert said == ["no task 7", "task 7 waits on no step (it is gone)"]


def test_a_url_without_the_password_the_server_asks_for_says_where_to_put_it(
    cli, postgres, monkeypatch, tmp_path
):
    """database.url names no password and ~/.pgpass has none (or is one libpq ignores):
    the tick and doctor say where the password goes (exit 2), not the driver's words."""
    name = postgres.create_database()
    url = f"postgresql://{postgres.user}@127.0.0.1:{postgres.port}/{name}"
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))
    configure_database(url, tmp_path / "pg.toml", monkeypatch)
    tick = cli("--json", "scheduler", "tick")
    assert tick.exit_code == 2, tick
    message = tick.json()["error"]["message"]
    assert message.startswith(
        f"PostgreSQL at 127.0.0.1:{postgres.port}/{name} asks for a password database.url "
        "does not give: put it there, or in ~/.pgpass"
    )
    checks = {c["name"]: c for c in cli("--json", "doctor").json()["checks"]}
    assert checks["database"]["status"] == "fail"
    assert checks["database"]["detail"] == message


@pytest.mark.skipif(shutil.which("faketime") is None, reason="needs faketime (.ci/run)")
def test_a_controller_whose_clock_is_off_the_servers_is_told_and_refused(
    postgres_url, tmp_path, monkeypatch
):
    """Controllers judge each other's leases by their own clocks: one a quarter of its
    lease behind would make its live jobs look abandoned to the others. Its tick does
    nothing (exit 2) and doctor says why; a few seconds off is a warning."""
    configure_database(postgres_url, tmp_path / "pg.toml", monkeypatch)
    assert run_process("db", "upgrade").exit_code == 0

    def skewed(offset: str, *args: str):
        argv = ["faketime", "-f", offset, sys.executable, "-m", "aiworker", "--json", *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        return done.returncode, json.loads(done.stdout)

    code, refused = skewed("-600s", "scheduler", "tick")
    assert (code, refused["error"]["code"]) == (2, "clock_skewed")
    assert "this host's clock is 600 s behind the database server's" in refused["error"]["message"]
    assert rows(postgres_url, "select count(*) from controllers") == [(0,)]  # nothing done
    code, report = skewed("-600s", "doctor")
    [database] = [c for c in report["checks"] if c["name"] == "database"]
    assert database["status"] == "fail"
    code, report = skewed("+10s", "doctor")
    [database] = [c for c in report["checks"] if c["name"] == "database"]
    assert database["status"] == "warn"
    assert "10 s ahead of the database server's" in database["detail"]


HEARTBEAT = """
import sys
import time
from aiworker.store.controllers import renew
from aiworker.store.engine import Database
db = Database(sys.argv[1], host="host-a", lease_s=60, instance="key-a host-a:/state")
with db.transaction() as connection:  # a job's heartbeat, as Heartbeat beats
    renew(connection, db.host, db.instance)
db.dispose()
"""


@pytest.mark.skipif(shutil.which("faketime") is None, reason="needs faketime (.ci/run)")
def test_a_live_job_on_a_host_whose_clock_is_behind_is_not_taken_for_abandoned(
    postgres_url, tmp_path, monkeypatch
):
    """Signs of life are written and judged by the database server's clock: a job on a
    host ten minutes behind renews its controller, and another controller's tick leaves
    its claim and attempt alone, though they began an hour ago."""
    config = tmp_path / "b.toml"
    config.write_text(f'[database]\nurl = "{postgres_url}"\n[controller]\nid = "host-b"\n')
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))
    assert run_process("db", "upgrade").exit_code == 0
    db = Database(postgres_url)
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        task = create_task(session, repo.id, "issue", issue_number=1, state="running").id
        start_attempt(session, task, "implementation", "script", None, None, {}, host="host-a")
    db.dispose()
    hour_ago = "now() - interval '1 hour'"
    rows(
        postgres_url,
        "update tasks set claim_slot = 1, claim_host = 'host-a', claim_token = '1-pid999999',"
        f" claimed_at = {hour_ago} where id = :task",
        task=task,
    )
    rows(postgres_url, f"update attempts set pid = 999999, started_at = {hour_ago}")
    argv = ["faketime", "-f", "-600s", sys.executable, "-c", HEARTBEAT, postgres_url]
    subprocess.run(argv, check=True, timeout=60)
    [(age,)] = rows(postgres_url, "select extract(epoch from now() - seen_at) from controllers")
    assert abs(age) < 30  # the server's time, not the host's ten minutes behind
    tick = run_process("--json", "scheduler", "tick")
    assert tick.exit_code == 0, tick
    assert tick.json()["recovered"] == []
    assert rows(postgres_url, "select state, claim_host from tasks") == [("running", "host-a")]
    assert rows(postgres_url, "select count(*) from attempts where finished_at is null") == [(1,)]


OTHER_PROCESS = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("PRAGMA journal_mode=WAL")
if len(sys.argv) > 2:
    connection.execute(sys.argv[2])
connection.close()
"""


def test_opening_the_store_again_keeps_its_open_connection_safe(upgraded, state_dir):
    """A tick opens the store a second time to poll while its first connection is open.
    That must not drop the process's lock on the file: another process closing the
    database would then take it for unused, checkpoint it and delete the WAL under this
    one, and this one's later commits would be lost or overwrite the other's pages."""
    env = Environment(state_dir, load_config(state_dir / "absent.toml", required=False))
    db = env.open_database()
    with db.write() as session:
        repo = ensure_repository(session, 1, "o", "r")
        repo_id = repo.id
    env.open_database().dispose()  # the second opening, as poll's
    other = [sys.executable, "-c", OTHER_PROCESS, str(upgraded)]
    subprocess.run(other, check=True)  # another process opens and closes the database
    assert Path(f"{upgraded}-wal").exists(), "the WAL of an open connection was deleted"
    with db.write() as session:
        for number in range(1, 51):
            create_task(session, repo_id, "issue", issue_number=number)
    subprocess.run(
        [*other, "UPDATE tasks SET title = 'by the other' WHERE issue_number = 1"], check=True
    )
    with db.write() as session:
        create_task(session, repo_id, "issue", issue_number=51)
    db.dispose()
    connection = sqlite3.connect(upgraded)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = connection.execute("SELECT count(*) FROM tasks").fetchone()
        title = connection.execute("SELECT title FROM tasks WHERE issue_number = 1").fetchone()
    finally:
        connection.close()
    assert rows == (51,)
    assert title == ("by the other",)


def test_a_new_store_is_private_from_the_start(cli, state_dir, monkeypatch):
    """Made under a umask that lets others read (022): the database and its journal files
    are 0600 all the same, so a copy of the state directory keeps them private."""
    import os

    old = os.umask(0o022)
    try:
        assert cli("db", "upgrade").exit_code == 0
        assert cli("status").exit_code == 0
    finally:
        os.umask(old)
    made = sorted(state_dir.glob("aiworker.db*"))
    assert made, "no database"
    assert {p.name: p.stat().st_mode & 0o777 for p in made} == {p.name: 0o600 for p in made}
