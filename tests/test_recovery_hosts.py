"""Recovering another controller's dead claim: charged once however many recover it."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta

from aiworker.config.loader import load_config
from aiworker.core.context import Environment
from aiworker.core.tasks.abandon import abandon
from aiworker.core.tasks.lifecycle import advance
from aiworker.core.tasks.recovery import recover_slots
from aiworker.store.attempts import attempts_of
from aiworker.store.claims import claim_next
from aiworker.store.controllers import renew
from aiworker.store.engine import Database
from aiworker.store.task_records import create_task, ensure_repository, task_row


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
        renew(session.connection(), "host-a", datetime.now(UTC) - timedelta(hours=1))
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
