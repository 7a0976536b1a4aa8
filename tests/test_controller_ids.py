"""Controllers on one database: one id per installation, and another's dead claim
recovered and charged once however many recover it."""

from __future__ import annotations

import socket
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from aiworker.config.loader import load_config
from aiworker.core.context import Environment
from aiworker.core.tasks.abandon import abandon
from aiworker.core.tasks.lifecycle import advance
from aiworker.core.tasks.recovery import recover_slots
from aiworker.errors import ControllerIdInUse
from aiworker.store.attempts import attempts_of
from aiworker.store.claims import claim_next
from aiworker.store.controllers import last_seen, renew, silent_since
from aiworker.store.engine import Database
from aiworker.store.task_records import create_task, ensure_repository, task_row
from tests.helpers import run_process


def controller(tmp_path, url: str, host: str) -> tuple[Environment, Database]:
    state = tmp_path / host
    state.mkdir()
    config = tmp_path / f"{host}.toml"
    config.write_text(f'[database]\nurl = "{url}"\n[controller]\nid = "{host}"\nlease = 600\n')
    env = Environment(state, load_config(config, required=True))
    return env, env.open_database()


def test_two_controllers_recovering_one_dead_claim_charge_it_once(upgraded, tmp_path):
    """Host A's job died before it recorded an attempt, and A went silent. B and C both
    find its claim past the lease: B records the death (an abandoned attempt) and, before
    B moves the task, C recovers the same claim. One abandoned attempt, one charge."""
    url = f"sqlite:///{upgraded}"
    a = Database(url, host="host-a", lease_s=600)
    with a.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        created = create_task(session, repo.id, "issue", issue_number=1).id
    task_id = claim_next(a, 1, "token-of-a-dead-job")
    assert task_id == created
    with a.write() as session:
        task = task_row(session, task_id)
        advance(session, task_id, "claimed", task.version, "running", "started", actor="slot-1")
        renew(session.connection(), "host-a", now=datetime.now(UTC) - timedelta(hours=1))
    a.dispose()
    with sqlite3.connect(upgraded) as raw:  # the claim is as old as A's silence
        raw.execute("update tasks set claimed_at = datetime('now', '-1 hour')")
    raw.close()
    env_b, db_b = controller(tmp_path, url, "host-b")
    env_c, db_c = controller(tmp_path, url, "host-c")
    with db_b.read() as session:
        claimed_at = task_row(session, task_id).claimed_at
    abandon(env_b, db_b, task_id, None, "implementation", "host-a is gone", claimed_at)
    [recovered] = recover_slots(env_c, db_c, [])
    assert (recovered.task, recovered.state) == (task_id, "ready")
    with db_c.read() as session:
        attempts = attempts_of(session, task_id)
        assert [(a.phase, a.outcome) for a in attempts] == [("implementation", "abandoned")]
        assert task_row(session, task_id).state == "ready"
    db_b.dispose()
    db_c.dispose()


def test_a_second_installation_with_the_same_controller_id_is_refused(upgraded, tmp_path):
    """Two state directories (as two cloned hosts with one host name would be) claiming
    one controller.id on one database: the second's tick is refused, names the id and
    both installations, and changes nothing; with its own id it runs."""
    url = f"sqlite:///{upgraded}"
    states = {}
    for name, host in (("first", "ctl"), ("second", "ctl"), ("third", "ctl-2")):
        config = tmp_path / f"{name}.toml"
        config.write_text(f'[database]\nurl = "{url}"\n[controller]\nid = "{host}"\n')
        states[name] = ("--state-dir", str(tmp_path / name), "--config", str(config))
    first = run_process(*states["first"], "--json", "scheduler", "tick")
    assert first.exit_code == 0, first
    before = sqlite3.connect(upgraded).execute("select * from controllers").fetchall()
    second = run_process(*states["second"], "--json", "scheduler", "tick")
    assert second.exit_code == 2, second
    error = second.json()["error"]
    assert error["code"] == "controller_id_in_use"
    assert "controller id 'ctl' is in use by another installation" in error["message"]
    assert str(tmp_path / "first") in error["message"]
    assert str(tmp_path / "second") in error["message"]
    assert "own controller.id" in error["message"]
    assert sqlite3.connect(upgraded).execute("select * from controllers").fetchall() == before
    assert run_process(*states["first"], "--json", "scheduler", "tick").exit_code == 0
    assert run_process(*states["third"], "--json", "scheduler", "tick").exit_code == 0


def test_an_installation_recorded_by_an_older_version_is_itself_after_the_upgrade(
    upgraded, tmp_path
):
    """Versions before the installation key recorded 'HOST:STATE (machine ID)': the same
    host, state directory and machine, upgraded, was refused for a whole lease as
    another installation, named '(machine ...)'. It is itself; another is still
    refused, named by its host and state directory."""
    url = f"sqlite:///{upgraded}"
    config = tmp_path / "ctl.toml"
    config.write_text(f'[database]\nurl = "{url}"\n[controller]\nid = "ctl"\n')
    machine = Path("/etc/machine-id").read_text().strip()[:12]
    for state, expected in (("mine", 0), ("elsewhere", 2)):
        where = f"{socket.gethostname()}:{(tmp_path / state).resolve()}"
        with sqlite3.connect(upgraded) as raw:
            raw.execute("delete from controllers")
            raw.execute(
                "insert into controllers (id, seen_at, started_at, instance) values "
                "('ctl', datetime('now'), datetime('now'), ?)",
                (f"{where} (machine {machine})",),
            )
        raw.close()
        args = ("--state-dir", str(tmp_path / "mine"), "--config", str(config))
        ticked = run_process(*args, "--json", "scheduler", "tick")
        assert ticked.exit_code == expected, ticked
    message = ticked.json()["error"]["message"]
    assert f"another installation ({where})" in message


def test_an_id_left_silent_past_its_lease_is_taken_over(upgraded):
    """A host whose state directory moved renews its id again once the old installation
    has been silent for the lease."""
    db = Database(f"sqlite:///{upgraded}")
    lease = timedelta(minutes=10)
    now = datetime.now(UTC)
    with db.transaction() as connection:
        renew(connection, "ctl", "host:/old (machine a)", lease, now - timedelta(minutes=11))
    with db.transaction() as connection:
        renew(connection, "ctl", "host:/new (machine a)", lease, now)
    with db.transaction() as connection, pytest.raises(ControllerIdInUse):
        renew(connection, "ctl", "host:/old (machine a)", lease, now)
    db.dispose()


def test_a_controller_is_judged_by_the_longer_of_both_leases(upgraded):
    """A controller that ticks hourly renews within its own (longer) lease: another with a
    10-minute lease does not count it gone after 20 minutes of silence, only after its
    own lease has passed."""
    db = Database(f"sqlite:///{upgraded}")
    now = datetime.now(UTC)
    with db.transaction() as connection:
        renew(connection, "hourly", "k1 h:/a", timedelta(hours=3), now - timedelta(minutes=20))
        renew(connection, "quick", "k2 h:/b", timedelta(minutes=10), now - timedelta(minutes=20))
    with db.read_connection() as connection:
        seen = last_seen(connection)
    mine = timedelta(minutes=10)
    assert silent_since(seen, "hourly", mine, now) is None
    assert silent_since(seen, "quick", mine, now) == seen["quick"].at
    assert silent_since(seen, "hourly", mine, now + timedelta(hours=3)) == seen["hourly"].at
    db.dispose()
