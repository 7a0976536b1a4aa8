"""cleanup removes only delivered tasks' leftovers, keeps evidence, and is idempotent."""

from __future__ import annotations

import sqlite3

from aiworker.store.engine import Database
from aiworker.store.task_records import create_task, ensure_repository
from tests.helpers import run_process


def test_cleanup_removes_delivered_leftovers_only(upgraded, state_dir, tmp_path):
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        done = create_task(session, repo.id, "issue", issue_number=1, state="done").id
        active = create_task(session, repo.id, "issue", issue_number=2, state="ready").id
    db.dispose()
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    workspaces = state_dir / "workspaces"
    delivered = workspaces / f"task-{done}-attempt-1"
    (delivered / "repo").mkdir(parents=True)
    (delivered / "repo" / "file").write_text("x" * 100)
    (delivered / "repo" / "link").symlink_to(outside)
    preserved = workspaces / f"task-{active}-attempt-2"
    preserved.mkdir()
    (preserved / "work").write_text("quota-preserved work")
    (state_dir / "logs").mkdir()
    (state_dir / "logs" / f"task-{done}.log").write_text("log")
    (state_dir / "logs" / f"task-{done}.log.1").write_text("rotated log")
    kept_files = state_dir / "attempts" / f"task-{done}-attempt-1"
    kept_files.mkdir(parents=True)
    (kept_files / "output.log").write_text("what the provider printed")
    still_needed = state_dir / "attempts" / f"task-{active}-attempt-2"
    still_needed.mkdir()
    cache = state_dir / "git-cache" / "repo-1.git"
    cache.mkdir(parents=True)

    first = run_process("--json", "cleanup")
    assert first.exit_code == 0, first
    report = first.json()
    assert sorted(item["path"] for item in report["removed"]) == sorted(
        [
            str(delivered),
            str(kept_files),
            str(state_dir / "logs" / f"task-{done}.log"),
            str(state_dir / "logs" / f"task-{done}.log.1"),
        ]
    )
    assert not delivered.exists()
    assert not kept_files.exists()
    assert still_needed.exists()
    assert preserved.exists()
    assert cache.exists()
    assert outside.read_text() == "keep me"
    conn = sqlite3.connect(upgraded)
    inventory = conn.execute("select task_id, action from cleanup_inventory").fetchall()
    conn.close()
    assert inventory == [(done, "removed")] * 4
    second = run_process("--json", "cleanup").json()
    assert (second["removed"], second["changed"]) == ([], False)
