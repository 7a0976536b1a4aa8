"""The scheduler's tick with real processes: slot limits, claims, stale recovery, gates, units."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from aiworker.store.engine import Database
from aiworker.store.models import Event, Task
from aiworker.store.task_records import create_task, ensure_repository
from tests.helpers import run_process
from tests.json_keys import assert_keys

RECORDER = Path(__file__).parent / "workers" / "phase_recorder.py"


@pytest.fixture
def scheduled(upgraded, tmp_path, monkeypatch):
    """30 ready issue tasks, 3 slots, and a recording stand-in for the implement phase."""
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        for number in range(1, 31):
            create_task(session, repo.id, "issue", issue_number=number)
    db.dispose()
    config = tmp_path / "config.toml"
    config.write_text(
        "shares = 3\n[scheduler.phase_commands]\n"
        f"implement = [{json.dumps(sys.executable)}, {json.dumps(str(RECORDER))}]\n"
    )
    log = tmp_path / "phases.log"
    monkeypatch.setenv("PHASE_LOG", str(log))
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))
    return upgraded, log


def phase_runs(log: Path) -> dict[int, dict]:
    runs: dict[int, dict] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        what, task, slot, pid, stamp = line.split()
        runs.setdefault(int(pid), {"task": int(task), "slot": int(slot)})[what] = float(stamp)
    return runs


def wait_for_ends(log: Path, count: int, timeout: float = 30) -> dict[int, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = phase_runs(log)
        if len(runs) >= count and all("end" in r for r in runs.values()):
            return runs
        time.sleep(0.1)
    raise AssertionError(f"phases did not finish: {phase_runs(log)}")


def test_sixteen_concurrent_ticks_respect_the_slots(scheduled, monkeypatch, tmp_path):
    db_path, log = scheduled
    # Jobs outlast every tick, however long 16 interpreters take to start on busy cores:
    # they end when the test says (a tick after a job ended would rightly reuse its slot).
    release = tmp_path / "release"
    monkeypatch.setenv("PHASE_RELEASE", str(release))
    ticks = [
        subprocess.Popen(
            [sys.executable, "-m", "aiworker", "--json", "scheduler", "tick"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(16)
    ]
    reports = []
    try:
        for proc in ticks:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode in (0, 75), err
            if proc.returncode == 0:
                reports.append(json.loads(out))
    finally:
        release.touch()  # the phases end, whatever the ticks did
    started = [item for report in reports for item in report["started"]]
    assert 1 <= len(started) <= 3
    runs = wait_for_ends(log, len(started))
    assert len(runs) == len(started)
    # At no moment did more than three phases run.
    edges = sorted(
        [(r["start"], 1) for r in runs.values()] + [(r["end"], -1) for r in runs.values()]
    )
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak <= 3
    assert len({r["slot"] for r in runs.values()}) == len(runs)
    db = Database(f"sqlite:///{db_path}")
    with db.read() as session:
        claimed = Counter(
            session.scalars(select(Event.task_id).where(Event.kind == "task.claimed"))
        )
        assert set(claimed.values()) == {1}
        assert sorted(claimed) == sorted(item["task"] for item in started)
        assert sorted(claimed) == sorted(r["task"] for r in runs.values())
        checks = session.scalars(select(Event).where(Event.kind == "scheduler.check")).all()
        assert sum(len(e.data["started"]) for e in checks) == len(started)
    db.dispose()


def test_killed_phase_leaves_a_stale_claim_the_next_tick_recovers(scheduled, monkeypatch):
    db_path, log = scheduled
    monkeypatch.setenv("PHASE_SECONDS", "60")
    first = run_process("--json", "scheduler", "tick")
    assert first.exit_code == 0, first
    started = first.json()["started"]
    assert len(started) == 3
    victim = started[0]
    deadline = time.monotonic() + 10
    while victim["pid"] not in phase_runs(log) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(victim["pid"], signal.SIGKILL)
    time.sleep(0.3)
    try:
        second = run_process("--json", "scheduler", "tick")
        assert second.exit_code == 0, second
        report = second.json()
        assert [(r["task"], r["state"]) for r in report["recovered"]] == [(victim["task"], "ready")]
        assert report["busy_slots"] == sorted(s["slot"] for s in started[1:])
        assert [s["slot"] for s in report["started"]] == [victim["slot"]]
        db = Database(f"sqlite:///{db_path}")
        with db.read() as session:
            # The job the tick started died: its death is an abandoned attempt, counted.
            retried = session.scalars(
                select(Event).where(Event.kind == "task.retry_scheduled")
            ).one()
            assert retried.task_id == victim["task"]
            assert retried.data["reason"].startswith("the job's process died")
            assert (retried.data["used"], retried.data["limit"]) == (1, 3)
        db.dispose()
    finally:
        for run in phase_runs(log):
            with contextlib.suppress(ProcessLookupError):
                os.kill(run, signal.SIGKILL)


def test_pause_resume_and_the_maintenance_gate(scheduled, state_dir):
    assert run_process("scheduler", "pause", "--reason", "upgrade").exit_code == 0
    paused = run_process("--json", "scheduler", "tick")
    assert paused.json()["status"] == "paused"
    status = run_process("--json", "scheduler", "status").json()
    assert (status["paused"], status["paused_reason"]) == (True, "upgrade")
    assert run_process("scheduler", "resume").exit_code == 0
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time; from pathlib import Path; from aiworker.runtime.locks import LockDir;"
            "l=LockDir(Path(sys.argv[1])).lock('maintenance'); l.try_acquire();"
            "print('held', flush=True); time.sleep(60)",
            str(state_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        gated = run_process("--json", "scheduler", "tick")
        assert gated.exit_code == 75, gated
        assert "maintenance" in gated.json()["error"]["message"]
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_a_pause_is_acknowledged_once_no_claim_of_a_running_tick_can_follow_it(
    scheduled, state_dir, hold_in_child
):
    """A tick that reached its claims when the operator paused: the pause is said only
    once that claim is over, and the tick claims nothing after it. Before, the pause was
    acknowledged at once and the tick went on to claim and start jobs."""
    holder = hold_in_child(state_dir, "discovery")  # a claim under way
    argv = [sys.executable, "-m", "aiworker", "--json", "scheduler"]
    try:
        tick = subprocess.Popen([*argv, "tick"], stdout=subprocess.PIPE, text=True)
        time.sleep(2)  # it waits for the lock at its first claim
        pause = subprocess.Popen([*argv, "pause"], stdout=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            pause.wait(timeout=3)  # not acknowledged while the claim is under way
    finally:
        holder.kill()
        holder.wait()
    paused, _ = pause.communicate(timeout=60)
    ticked, _ = tick.communicate(timeout=60)
    assert (pause.returncode, json.loads(paused)["paused"]) == (0, True)
    assert tick.returncode == 0, ticked
    assert (json.loads(ticked)["status"], json.loads(ticked)["started"]) == ("paused", [])
    db = Database(f"sqlite:///{scheduled[0]}")
    with db.read() as session:
        claimed = session.scalars(select(Event).where(Event.kind == "task.claimed")).all()
    db.dispose()
    assert claimed == []


def test_a_pause_that_outwaits_a_long_claim_says_one_more_job_may_start(
    upgraded, state_dir, cli, monkeypatch, hold_in_child
):
    """A tick polling a slow forge holds discovery.lock past the pause's wait: the pause
    is acknowledged (it stands), and says that this tick may still start one job."""
    from aiworker.core import scheduler_state

    monkeypatch.setattr(scheduler_state, "DISCOVERY_WAIT_SECONDS", 1.0)
    holder = hold_in_child(state_dir, "discovery")  # a tick's claim that goes on
    paused = cli("scheduler", "pause", "--reason", "forge upgrade")
    holder.kill()
    holder.wait()
    assert paused.exit_code == 0, paused
    assert paused.stdout.strip() == (
        "scheduler paused; a tick has claimed for over 1 s (a slow forge?): it may start one "
        "more job before it reads the pause"
    )
    assert cli("--json", "scheduler", "pause").json()["pending"] is None  # nothing holds it


def test_every_kind_of_work_has_its_phase(tmp_path):
    from aiworker.config.loader import load_config
    from aiworker.core.context import Environment
    from aiworker.core.scheduling.phase_commands import runnable_kinds

    env = Environment(tmp_path / "state", load_config(tmp_path / "absent.toml", required=False))
    kinds, skipped = runnable_kinds(env)
    assert (sorted(kinds), skipped) == (["feature", "issue", "milestone", "plan"], {})


def test_start_now_while_paused_says_the_check_starts_no_work(upgraded, state_dir):
    assert run_process("scheduler", "pause", "--reason", "forge upgrade").exit_code == 0
    asked = run_process("scheduler", "start-now")
    assert asked.exit_code == 0, asked
    assert "; the scheduler is paused: forge upgrade (by " in asked.stdout
    assert asked.stdout.rstrip().endswith("; no work starts until resumed")
    assert run_process("scheduler", "resume").exit_code == 0
    assert run_process("--json", "scheduler", "start-now").json()["paused"] is None


def test_start_now_runs_a_check_through_the_tick(scheduled, monkeypatch):
    _db_path, log = scheduled
    monkeypatch.setenv("PHASE_SECONDS", "0.2")
    result = run_process("--json", "scheduler", "start-now")
    assert result.exit_code == 0, result
    assert_keys("scheduler start-now", result.json())
    assert result.json()["via"] == "tick"
    runs = wait_for_ends(log, 3)
    assert len(runs) == 3
    deadline = time.monotonic() + 20
    status = run_process("--json", "scheduler", "status").json()
    while status["last_check"] is None and time.monotonic() < deadline:
        time.sleep(0.2)
        status = run_process("--json", "scheduler", "status").json()
    assert status["last_check"] is not None
    assert status["check_requested"] is False


def test_phase_commands_carry_this_state_and_only_an_existing_config(tmp_path):
    from aiworker.config.loader import load_config
    from aiworker.core.context import Environment
    from aiworker.core.scheduling.phase_commands import argv_for

    absent = load_config(tmp_path / "absent.toml", required=False)
    argv = argv_for(Environment(tmp_path / "state", absent), "issue", "claimed", 7, 2)
    assert argv[-7:] == [
        "--state-dir",
        str(tmp_path / "state"),
        "implement",
        "--task",
        "7",
        "--slot",
        "2",
    ]
    assert "--config" not in argv
    present = tmp_path / "c.toml"
    present.write_text("shares = 2\n")
    argv = argv_for(
        Environment(tmp_path / "state", load_config(present, required=True)),
        "feature",
        "repairing",
        1,
        1,
    )
    assert argv[-5:] == ["repair", "--task", "1", "--slot", "1"]
    assert argv[argv.index("--config") + 1] == str(present)


def test_a_check_requested_while_a_tick_runs_outlives_that_tick(tmp_path):
    """Under systemd a job's request starts aiworker-scheduler.service, which a running
    tick absorbs: that tick, begun before the request, must not answer it by clearing
    it, or the check waits for the next interval."""
    from datetime import UTC, datetime

    from aiworker.config.loader import load_config
    from aiworker.core.context import Environment
    from aiworker.core.scheduler_state import SchedulerState, record_check, request_check

    env = Environment(tmp_path / "state", load_config(tmp_path / "absent.toml", required=False))
    request_check(env)
    began = datetime.now(UTC).isoformat()  # a tick begins after that request: it answers it
    record_check(env, began, datetime.now(UTC).isoformat(), None)
    assert SchedulerState.load(env.state_dir).check_requested is False
    began = datetime.now(UTC).isoformat()  # a tick begins; a job asks while it runs
    request_check(env)
    record_check(env, began, datetime.now(UTC).isoformat(), None)
    state = SchedulerState.load(env.state_dir)
    assert state.check_requested is True
    assert state.due(3600, datetime.now(UTC))  # the timer's next --if-due runs a tick


def test_a_tick_whose_poll_failed_exits_as_the_poll_would(forge, upgraded, tmp_path, monkeypatch):
    """A revoked token stops every poll: the tick does the rest of its work, reports the
    error and exits 2, so that its unit shows failed (where the operator looks); a forge
    that is down exits 75, which the unit counts as success: it passes by itself."""
    from tests.helpers import configure

    config = configure(tmp_path, forge, monkeypatch)
    monkeypatch.setenv("AIWORKER_TEST_WORKER_TOKEN", "revoked-0000")
    revoked = run_process("--json", "scheduler", "tick")
    assert revoked.exit_code == 2, revoked
    report = revoked.json()
    assert (report["status"], report["started"]) == ("checked", [])
    assert "401" in report["poll_error"]
    # The timer's wake-ups between checks (every 10 s) keep the unit failed meanwhile.
    waking = run_process("--json", "scheduler", "tick", "--if-due")
    assert waking.exit_code == 2, waking
    assert waking.json()["status"] == "not_due"
    assert waking.json()["poll_error"] == report["poll_error"]
    monkeypatch.setenv("AIWORKER_TEST_WORKER_TOKEN", forge.tokens["worker-bot"])
    config.write_text(config.read_text().replace(forge.url, "http://127.0.0.1:9"))
    down = run_process("--json", "scheduler", "tick")
    assert down.exit_code == 75, down
    assert "connection refused" in down.json()["poll_error"]
    config.write_text(config.read_text().replace("http://127.0.0.1:9", forge.url))
    assert run_process("--json", "scheduler", "tick").exit_code == 0
    assert run_process("--json", "scheduler", "tick", "--if-due").exit_code == 0


def test_a_poll_refused_for_an_older_store_is_no_poll_failure_after_the_upgrade(
    forge, upgraded, tmp_path, monkeypatch
):
    """The operator installs a new version and its timer polls before `db upgrade`: the
    poll is refused, naming the upgrade; once upgraded, status does not go on saying to
    run it, and the timer's wake-ups do not exit as that refusal did."""
    import sqlite3

    from tests.helpers import configure

    configure(tmp_path, forge, monkeypatch)
    with sqlite3.connect(upgraded) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '0008_authorized_scope'")
    refused = run_process("--json", "poll")
    assert refused.exit_code == 2, refused
    assert "run `aiworker db upgrade`" in refused.json()["error"]["message"]
    assert run_process("db", "upgrade").exit_code == 0
    scheduler = run_process("--json", "status").json()["scheduler"]
    assert (scheduler["poll_error"], scheduler["poll_failures"]) == (None, 0)
    assert run_process("--json", "scheduler", "tick", "--if-due").exit_code == 0


def test_a_phase_command_that_cannot_start_fails_the_tick_saying_so_and_charges_nothing(
    scheduled, tmp_path
):
    """scheduler.phase_commands names a program that is not there (a wrapper on another
    host's path): the tick fails (exit 1, seen where the unit fails) saying which program
    and which setting, its claim is given back and nothing is charged; an empty program
    is refused by the configuration itself."""
    db_path, _ = scheduled
    config = Path(os.environ["AIWORKER_CONFIG"])
    config.write_text('shares = 1\n[scheduler.phase_commands]\nimplement = ["/nonexistent/wrap"]\n')
    failed = run_process("--json", "scheduler", "tick")
    assert failed.exit_code == 1, failed
    message = failed.json()["error"]["message"]
    assert message == (
        "'/nonexistent/wrap' cannot be started: No such file or directory; check "
        "scheduler.phase_commands in the configuration; the claim of task 1 was given back"
    )
    db = Database(f"sqlite:///{db_path}")
    with db.read() as session:
        task = session.get(Task, 1)
        assert (task.state, task.claim_slot) == ("ready", None)
        assert session.scalars(select(Event).where(Event.kind == "attempt.started")).all() == []
    db.dispose()
    config.write_text('[scheduler.phase_commands]\nimplement = [""]\n')
    refused = run_process("--json", "scheduler", "tick")
    assert refused.exit_code == 2, refused
    assert refused.json()["error"]["details"] == [
        "scheduler.phase_commands: implement: its first word must name the program to run"
    ]
