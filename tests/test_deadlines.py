"""Task deadlines through real ticks: a provider run that would go on is stopped at what
is left of the task's deadline, the next tick ends the task as failed with the reason
and a comment listing its attempts, and a retry gives it a new clock. Time in a person's
hands (a question, a pause) never counts."""

from __future__ import annotations

import json
import time
from datetime import datetime

from aiworker.runtime.processes import process_alive
from tests.delivery_fixtures import script_installation, write_scenario
from tests.helpers import configure
from tests.test_fault_injection import tick
from tests.test_implement import FIX, query, result_doc
from tests.test_lifecycle import wait_for

DEADLINE_S = 8


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def env_lock(state_dir, name):
    """Lock NAME of the installation at STATE_DIR, taken as another job would hold it."""
    from aiworker.runtime.locks import LockDir

    lock = LockDir(state_dir).lock(name)
    assert lock.try_acquire()
    return lock


def test_a_run_stops_at_the_deadline_and_the_tick_ends_the_task(
    forge, upgraded, state_dir, tmp_path, monkeypatch, cli
):
    config = configure(tmp_path, forge, monkeypatch)
    # A model that would take ten minutes.
    write_scenario(
        tmp_path / "scenario.json", sleep_s=600, edits={"calc.py": FIX}, result=result_doc()
    )
    config.write_text(
        '\nproviders = ["script"]\n[provider_options.script]\nscenario = "scenario.json"\n'
        + config.read_text()
        + f"[scheduler]\nfollow_up = false\n[deadlines]\ntask = {DEADLINE_S}\n"
    )
    assert cli("poll").exit_code == 0
    first = tick(cli, monkeypatch)  # waits for the job it started to end
    assert [job["task"] for job in first["started"]] == [1]
    [(outcome, reason, started, finished)] = query(
        upgraded, "select outcome, reason, started_at, finished_at from attempts"
    )
    assert (outcome, reason) == ("transient", f"the provider run timed out after {DEADLINE_S} s")
    assert (at(finished) - at(started)).total_seconds() < 120  # not the model's 600 s
    assert query(upgraded, "select state from tasks") == [("ready",)]

    # Paused, nothing could move the task on: it is not ended for its time.
    assert cli("scheduler", "pause").exit_code == 0
    assert tick(cli, monkeypatch)["expired"] == []
    assert cli("scheduler", "resume").exit_code == 0
    # A job holding the task (here its lock, as a delivery step holds it) keeps it.
    held = env_lock(state_dir, "task-1")
    try:
        assert tick(cli, monkeypatch)["expired"] == []
    finally:
        held.release()
    assert query(upgraded, "select state from tasks") == [("ready",)]
    ended = tick(cli, monkeypatch)
    assert [(e["task"], e["from"]) for e in ended["expired"]] == [(1, "ready")]
    assert ended["started"] == []
    [(state,)] = query(upgraded, "select state from tasks")
    assert state == "failed"
    [(data, failed_at)] = query(
        upgraded, "select data, created_at from events where kind = 'task.failed'"
    )
    assert json.loads(data)["reason"].startswith(f"its deadline passed: {DEADLINE_S / 3600:g} h")
    # Within the deadline and the five minutes the issue allows, here a tick's wait.
    assert (at(failed_at) - at(started)).total_seconds() < DEADLINE_S + 300
    [comment] = [
        c.body
        for c in forge.client("alice").comments("team", "app", 1)
        if "its deadline passed" in c.body
    ]
    assert "the provider run timed out" in comment  # the attempts, listed

    # A retry is a new start: the next tick runs it rather than ending it again.
    assert cli("--json", "task", "retry", "1").exit_code == 0
    again = tick(cli, monkeypatch)
    assert (again["expired"], [job["task"] for job in again["started"]]) == ([], [1])


def test_time_in_a_persons_hands_does_not_count(upgraded):
    """The clock starts with the first attempt since the task was last handed back."""
    from aiworker.core.tasks.deadlines import RESTARTS
    from aiworker.core.tasks.lifecycle import advance
    from aiworker.store.attempts import finish_attempt, start_attempt
    from aiworker.store.deadlines import clock_start
    from aiworker.store.engine import Database
    from aiworker.store.models import Attempt
    from aiworker.store.task_records import create_task, ensure_repository

    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        task = create_task(session, repo.id, "issue", issue_number=4, title="Crash")
        assert clock_start(session, task.id, RESTARTS) is None  # nothing started yet
        version = advance(session, task.id, "ready", task.version, "claimed", "claimed")
        version = advance(session, task.id, "claimed", version, "running", "implementing")
        first = start_attempt(session, task.id, "implementation", "script", None, None, {})
        finish_attempt(session, first, "succeeded")
        started = session.get(Attempt, first).started_at
        assert clock_start(session, task.id, RESTARTS) == started
        version = advance(session, task.id, "running", version, "needs_input", "questions")
        version = advance(session, task.id, "needs_input", version, "ready", "answered")
        assert clock_start(session, task.id, RESTARTS) is None  # handed back: a new clock
        second = start_attempt(session, task.id, "implementation", "script", None, None, {})
        assert clock_start(session, task.id, RESTARTS) == session.get(Attempt, second).started_at
    db.dispose()


def test_a_milestone_counts_only_while_its_plan_runs_its_milestones(upgraded):
    """While its plan waits for a person (approval again after an edit), a milestone's
    time does not run out; the plan's hand-back starts the milestone's clock anew."""
    from datetime import UTC, timedelta

    from aiworker.core.tasks.deadlines import RESTARTS
    from aiworker.core.tasks.lifecycle import advance
    from aiworker.core.tasks.states import AWAITING_WORK
    from aiworker.store.attempts import finish_attempt, start_attempt
    from aiworker.store.deadlines import overdue
    from aiworker.store.engine import Database
    from aiworker.store.task_records import create_task, ensure_repository

    db = Database(f"sqlite:///{upgraded}")
    later = datetime.now(UTC) + timedelta(days=2)

    def late():
        with db.read() as session:
            found = overdue(session, AWAITING_WORK, RESTARTS, later, 86_400, "milestones")
            return [task_id for task_id, *_ in found]

    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        plan = create_task(session, repo.id, "plan", issue_number=7, title="Plan")
        child = create_task(session, repo.id, "milestone", title="Step 1", parent_id=plan.id)
        state, version = "ready", plan.version
        for to_state in ("claimed", "planning", "awaiting_plan_approval", "milestones"):
            version = advance(session, plan.id, state, version, to_state, "moved")
            state = to_state
        attempt = start_attempt(session, child.id, "implementation", "script", None, None, {})
        finish_attempt(session, attempt, "succeeded")
    assert late() == [child.id]  # the plan runs its milestones: the child's time counts
    with db.write() as session:
        version = advance(session, plan.id, "milestones", version, "awaiting_plan_approval", "x")
    assert late() == []  # the plan waits for a person
    with db.write() as session:
        advance(session, plan.id, "awaiting_plan_approval", version, "milestones", "approved")
    assert late() == []  # handed back: no attempt of the child since
    db.dispose()


def test_a_job_stuck_past_its_deadline_is_stopped_and_the_task_ended(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    """A job that hangs after its provider run (a call that never returns) keeps its
    heartbeat, so recovery would leave it for ever: the tick stops it once it ran
    `deadlines.stuck` past its task's deadline, and the deadline ends the task."""
    extra = f"[scheduler]\nfollow_up = false\n[deadlines]\ntask = {DEADLINE_S}\nstuck = 2\n"
    script_installation(
        tmp_path, forge, monkeypatch, extra, edits={"calc.py": FIX}, result=result_doc()
    )
    assert cli("poll").exit_code == 0
    with monkeypatch.context() as scoped:
        scoped.setenv("AIWORKER_FAILPOINT", "implementation.after_run:hang")
        first = cli("--json", "scheduler", "tick")
    [job] = first.json()["started"]
    (started,) = wait_for(upgraded, "select started_at from attempts", timeout=120)
    # Past the deadline the job still runs, held by nothing but its hang.
    stuck_at = at(started).timestamp() + DEADLINE_S + 2
    time.sleep(max(0.0, stuck_at - time.time()) + 0.5)
    assert process_alive(job["pid"])
    assert query(upgraded, "select state from tasks") == [("running",)]

    report = tick(cli, monkeypatch)
    [stopped] = report["stuck"]
    assert stopped["task"] == 1
    assert job["pid"] in stopped["pids"]
    assert stopped["reason"].startswith("its job still ran 2 s after its deadline")
    assert not process_alive(job["pid"])
    assert [(e["task"], e["from"]) for e in report["expired"]] == [(1, "ready")]
    assert query(upgraded, "select state, claim_slot from tasks") == [("failed", None)]
    [(outcome,)] = query(upgraded, "select outcome from attempts")
    assert outcome == "interrupted"  # closed by its own guard, not left to recovery
    [(data,)] = query(upgraded, "select data from events where kind = 'task.jobs_stopped'")
    assert json.loads(data)["reason"].endswith("so it was stopped")
