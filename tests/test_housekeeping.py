"""Housekeeping in the tick: finished tasks' files removed on schedule, check receipts pruned."""

from __future__ import annotations

import os
import sqlite3
from datetime import UTC, datetime, timedelta

import pytest

from aiworker.store.engine import Database
from aiworker.store.task_records import create_task, ensure_repository
from tests.test_implement import query


@pytest.fixture
def configured(tmp_path, monkeypatch):
    def write(text: str) -> None:
        config = tmp_path / "config.toml"
        config.write_text(text)
        monkeypatch.setenv("AIWORKER_CONFIG", str(config))

    return write


def test_the_tick_keeps_only_the_latest_check_receipts(cli, upgraded, configured):
    configured("[housekeeping]\ncheck_events = 10\n")
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        create_task(session, repo.id, "issue", issue_number=1, state="failed")
    db.dispose()
    ticks = [cli("--json", "scheduler", "tick") for _ in range(13)]
    assert all(t.exit_code == 0 for t in ticks)
    checks = query(upgraded, "select id from events where kind = 'scheduler.check' order by id")
    assert len(checks) == 10
    assert query(upgraded, "select max(id) from events")[0][0] == checks[-1][0]
    # Task history is never pruned.
    assert query(upgraded, "select kind from events where task_id is not null") == [
        ("task.created",)
    ]


def _artifacts(state_dir, task_id):
    workspace = state_dir / "workspaces" / f"task-{task_id}-implementation-1"
    (workspace / "repo").mkdir(parents=True)
    (workspace / "repo" / "file").write_text("x" * 100)
    (state_dir / "logs").mkdir(exist_ok=True)
    log = state_dir / "logs" / f"task-{task_id}.log"
    log.write_text("log\n")
    return {str(workspace), str(log)}


def test_finished_tasks_files_go_on_schedule(cli, upgraded, state_dir, configured):
    configured("")
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        ids = {
            state: create_task(session, repo.id, "issue", issue_number=n, state=state).id
            for n, state in enumerate(("done", "failed", "cancelled", "needs_input"), 1)
        }
    db.dispose()
    files = {state: _artifacts(state_dir, task_id) for state, task_id in ids.items()}
    old = (datetime.now(UTC) - timedelta(days=8)).replace(tzinfo=None).isoformat(" ")
    conn = sqlite3.connect(upgraded)
    with conn:
        conn.execute("update tasks set updated_at = ? where id = ?", (old, ids["cancelled"]))
    conn.close()
    report = cli("--json", "scheduler", "tick").json()
    cleaned = {item["path"] for item in report["cleaned"]}
    assert cleaned == files["done"] | files["cancelled"]
    for state in ("failed", "needs_input"):
        assert all(os.path.exists(p) for p in files[state]), state
    inventory = query(upgraded, "select task_id, action, reason from cleanup_inventory order by id")
    assert {(t, a) for t, a, _ in inventory} == {
        (ids["done"], "removed"),
        (ids["cancelled"], "removed"),
    }
    assert any("cancelled 7+ days ago" in reason for _, _, reason in inventory)
    assert cli("--json", "scheduler", "tick").json()["cleaned"] == []
    # An operator who keeps nothing around removes failed work's files at once.
    configured("[housekeeping]\nretention_days = 0\n")
    again = cli("--json", "cleanup").json()
    assert {item["path"] for item in again["removed"]} == files["failed"]
    assert cli("--json", "cleanup").json()["changed"] is False
