"""status: task counts by state, slots with their holders, the last check."""

from __future__ import annotations

import subprocess
import sys

from aiworker.store.engine import Database
from aiworker.store.task_records import create_task, ensure_repository
from aiworker.store.tasks import append_event, claim


def test_status_counts_tasks_and_shows_slots(cli, upgraded, tmp_path, state_dir):
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        tasks = [create_task(session, repo.id, "issue", issue_number=n) for n in range(3)]
        create_task(session, repo.id, "plan", issue_number=9, state="paused")
    with db.write() as session:
        assert claim(session, tasks[0].id, tasks[0].version, slot=2, holder_token="h")
        append_event(session, "scheduler.check", data={"found": 4})
    db.dispose()
    config = tmp_path / "c.toml"
    config.write_text("shares = 2\n")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time; from pathlib import Path; from aiworker.runtime.locks import LockDir;"
            "l=LockDir(Path(sys.argv[1])).slot(2); l.try_acquire(); print('held', flush=True);"
            "time.sleep(60)",
            str(state_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        result = cli("--json", "--config", str(config), "status")
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert result.exit_code == 0, result
    report = result.json()
    assert report["tasks"]["ready"] == 2
    assert report["tasks"]["claimed"] == 1
    assert report["tasks"]["paused"] == 1
    assert report["total_tasks"] == 4
    assert report["slots"] == [
        {"slot": 1, "busy": False, "holder_pid": None, "task_id": None, "task_state": None},
        {
            "slot": 2,
            "busy": True,
            "holder_pid": holder.pid,
            "task_id": tasks[0].id,
            "task_state": "claimed",
        },
    ]
    assert report["last_check"] is not None


def test_status_human_table(cli, upgraded):
    result = cli("status")
    assert result.exit_code == 0, result
    assert "Scheduler: running" in result.stdout
    assert "Last check: never" in result.stdout
    assert "Tasks: none" in result.stdout
    every = cli("status", "--all")
    assert "ready" in every.stdout
    assert "cancelled" in every.stdout
