"""The host's wall clock is stepped (an NTP correction after boot, a resumed VM, an
operator's `date -s`) while controllers share one store: a live controller's work is
not taken from it when the clock jumps forward, and a dead one's is not left waiting for
as long as the clock was set back. Each tick is a real process whose wall clock is
shifted (tests/clockshift); the time that counts real time is left as a step leaves it."""

from __future__ import annotations

import json
import time
from pathlib import Path

from aiworker.core.tasks.lifecycle import advance
from aiworker.core.tasks.signs_of_life import watched
from aiworker.store.attempts import start_attempt
from aiworker.store.claims import claim_next
from aiworker.store.controllers import last_seen, renew
from aiworker.store.engine import Database
from aiworker.store.task_records import create_task, ensure_repository, task_row
from tests.helpers import run_process
from tests.test_implement import query

SHIFT = str(Path(__file__).resolve().parent / "clockshift")


def _running_on_host_a(upgraded: Path, lease: int) -> int:
    """A task claimed and running on controller host-a, its attempt open, host-a alive
    now; the task's id."""
    a = Database(f"sqlite:///{upgraded}", host="host-a", lease_s=lease)
    with a.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        create_task(session, repo.id, "issue", issue_number=1)
    task_id = claim_next(a, 1, "slot-1-pid999999")
    assert task_id is not None
    with a.write() as session:
        task = task_row(session, task_id)
        advance(session, task_id, "claimed", task.version, "running", "started", actor="slot-1")
        start_attempt(
            session, task_id, "implementation", "script", None, None, {}, pid=1, host="host-a"
        )
        renew(session.connection(), "host-a", None)
    a.dispose()
    return task_id


def _tick_on_host_b(tmp_path: Path, upgraded: Path, lease: int, shift_s: float) -> list[dict]:
    """One tick of controller host-b, its wall clock SHIFT_S off; what it recovered."""
    config = tmp_path / "host-b.toml"
    config.write_text(
        f'check_interval = 10\n[database]\nurl = "sqlite:///{upgraded}"\n'
        f'[controller]\nid = "host-b"\nlease = {lease}\n'
    )
    state = tmp_path / "host-b"
    state.mkdir(exist_ok=True)
    shifted = {"PYTHONPATH": SHIFT, "AIWORKER_TEST_CLOCK_SHIFT_S": str(shift_s)}
    tick = run_process(
        "--json", "--state-dir", str(state), "--config", str(config), "scheduler", "tick",
        env=shifted,
    )  # fmt: skip
    assert tick.exit_code in (0, 1), tick  # no forge is configured: its poll fails
    recovered: list[dict] = json.loads(tick.stdout)["recovered"]
    return recovered


def test_a_clock_set_forward_takes_no_work_from_a_live_controller(tmp_path, upgraded):
    assert _tick_on_host_b(tmp_path, upgraded, 60, 0) == []  # host-b looks, idle
    task = _running_on_host_a(upgraded, lease=60)
    # Two hours forward, seconds later: host-a renewed within its lease, in real time.
    # Before, its claim was recovered, its attempt abandoned and charged, and the task
    # run again by another controller while host-a's job still ran. The first look after
    # the step sees host-a's sign of life for the first time (it knows its clock stepped
    # since its last look); the next has watched it.
    assert _tick_on_host_b(tmp_path, upgraded, 60, 2 * 3600) == []
    assert _tick_on_host_b(tmp_path, upgraded, 60, 2 * 3600) == []
    assert query(upgraded, "select state, claim_host from tasks") == [("running", "host-a")]
    assert query(upgraded, f"select outcome from attempts where task_id = {task}") == [(None,)]


def test_a_clock_set_back_leaves_a_dead_controllers_work_waiting_no_longer(tmp_path, upgraded):
    task = _running_on_host_a(upgraded, lease=11)
    assert _tick_on_host_b(tmp_path, upgraded, 11, 0) == []
    time.sleep(12)  # host-a is silent for longer than its lease, in real time
    # The clock is an hour behind host-a's last sign of life. Before, host-b waited for
    # that hour too.
    [recovered] = _tick_on_host_b(tmp_path, upgraded, 11, -3600)
    assert recovered["task"] == task
    assert recovered["reason"].startswith("controller host-a is gone")
    # host-a's attempt is closed; host-b may already have claimed the task again and
    # started its own (which fails at once here, with no forge configured).
    mine = f"select outcome from attempts where task_id = {task} and host = 'host-a'"
    assert query(upgraded, mine) == [("abandoned",)]


def test_a_fresh_claim_of_a_controller_that_was_quiet_is_its_own(tmp_path, upgraded):
    """host-b has watched host-a's sign of life stay unchanged for longer than the lease
    (its timer is off); then host-a claims a task by hand and starts it, its first
    heartbeat a quarter lease away. The claim, seconds old, is a sign of life too."""
    a = Database(f"sqlite:///{upgraded}", host="host-a", lease_s=11)
    with a.write() as session:
        renew(session.connection(), "host-a", None)
        repo = ensure_repository(session, 1, "team", "app")
        create_task(session, repo.id, "issue", issue_number=1)
    (tmp_path / "host-b").mkdir()
    with a.read_connection() as connection:
        watched(tmp_path / "host-b", last_seen(connection))  # host-b looks
    time.sleep(12)
    task_id = claim_next(a, 1, "slot-1-pid999999")
    with a.write() as session:
        task = task_row(session, task_id)
        advance(session, task_id, "claimed", task.version, "running", "started", actor="slot-1")
        start_attempt(
            session, task_id, "implementation", "script", None, None, {}, pid=1, host="host-a"
        )
    a.dispose()
    assert _tick_on_host_b(tmp_path, upgraded, 11, 0) == []


def test_a_damaged_record_of_signs_of_life_is_watched_afresh(tmp_path, upgraded):
    """The record is this host's own file; damaged (a torn copy, a hand edit), the
    controllers in it are watched from now on, and recovery goes on."""
    task = _running_on_host_a(upgraded, lease=60)
    assert _tick_on_host_b(tmp_path, upgraded, 60, 0) == []
    record = tmp_path / "host-b" / "signs-of-life.json"
    document = json.loads(record.read_text())
    document["hosts"]["host-a"][1] = "not a time"
    record.write_text(json.dumps(document))
    assert _tick_on_host_b(tmp_path, upgraded, 60, 0) == []
    assert query(upgraded, f"select outcome from attempts where task_id = {task}") == [(None,)]
