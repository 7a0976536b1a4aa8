"""Eight real processes race to claim the same 200 tasks through compare-and-update, on
SQLite and on PostgreSQL."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

from aiworker.store.engine import Database
from aiworker.store.models import Event, Task
from aiworker.store.task_records import create_task, ensure_repository

WORKER = Path(__file__).parent / "workers" / "claim_worker.py"


def race(url: str, tmp_path: Path, processes: int, mode: str) -> list[dict]:
    go = tmp_path / "go.lock"
    go.touch()
    gate = os.open(go, os.O_RDWR)
    fcntl.flock(gate, fcntl.LOCK_EX)
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), url, str(go), str(slot), mode],
            stdout=subprocess.PIPE,
            text=True,
        )
        for slot in range(1, processes + 1)
    ]
    for proc in procs:
        assert proc.stdout.readline() == "ready\n"
    fcntl.flock(gate, fcntl.LOCK_UN)
    os.close(gate)
    reports = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        reports.append(json.loads(out))
    return reports


@pytest.mark.parametrize("mode", ["optimistic", "next"])
def test_every_task_is_claimed_exactly_once(store_url, tmp_path, mode):
    url = store_url
    db = Database(url)
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        for number in range(1, 201):
            create_task(session, repo.id, "issue", issue_number=number)
    reports = race(url, tmp_path, processes=8, mode=mode)
    won = Counter(task_id for report in reports for task_id in report["won"])
    assert len(won) == 200
    assert set(won.values()) == {1}
    # Every process raced from the same gate; which ones win is up to the scheduler.
    assert len(reports) == 8
    with db.read() as session:
        states = session.execute(select(Task.state, func.count()).group_by(Task.state)).all()
        assert states == [("claimed", 200)]
        claimed_events = session.scalars(
            select(Event.task_id).where(Event.kind == "task.claimed")
        ).all()
        assert sorted(claimed_events) == sorted(won)
        # The slot recorded on each task is the slot of the process that won it.
        by_task = {t.id: t.claim_slot for t in session.scalars(select(Task))}
    for report in reports:
        assert all(by_task[task_id] == report["slot"] for task_id in report["won"])
    db.dispose()
