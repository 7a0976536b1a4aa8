"""The job's guard and the lifecycle's small promises, each on a real store and real processes."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from aiworker.adapters.forgejo.errors import ForgeUnavailable
from aiworker.config.loader import load_config
from aiworker.core.context import Environment
from aiworker.core.phases.job import Job
from aiworker.core.phases.table import NAMES
from aiworker.core.tasks.lifecycle import TransitionRefused, advance
from aiworker.core.tasks.recovery import job_alive
from aiworker.runtime.execution import Limits, run_job
from aiworker.runtime.interrupts import Interrupted, signals_raise
from aiworker.store.attempts import finish_attempt
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task
from aiworker.store.task_records import create_task, ensure_repository
from tests.test_implement import query


@pytest.fixture
def task(upgraded):
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        task_id = create_task(session, repo.id, "issue", issue_number=1).id
    yield db, task_id
    db.dispose()


def tagged(tag: bytes) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and tag in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
        except OSError:
            continue
    return found


def test_a_sigterm_during_a_run_kills_the_job_before_the_phase_unwinds(tmp_path):
    tag = f"AIWORKER_ATTEMPT_ID=guard-test-{os.getpid()}"
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    with pytest.raises(Interrupted), signals_raise():
        run_job(
            [sys.executable, "-c", "import time; time.sleep(30)"],
            cwd=tmp_path,
            env={"PATH": os.environ["PATH"], tag.split("=", 1)[0]: tag.split("=", 1)[1]},
            tag=tag,
            limits=Limits(timeout_s=60),
        )
    timer.join()
    assert tagged(tag.encode()) == []
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def guarded(db, task_id, phase, body, state=None):
    """Run BODY(job) inside the job's guard, as the driver does, the task in STATE."""
    if state is not None:
        with db.write() as session:
            session.get(Task, task_id).state = state
    with db.read() as session:
        task = session.get(Task, task_id)
        repo = session.get(Repository, task.repository_id)
    state_dir = Path(os.environ["AIWORKER_STATE_DIR"])
    env = Environment(state_dir, load_config(state_dir / "absent.toml", required=False))
    job = Job(env, db, NAMES[phase], task, repo, str(task.state))
    with job:
        body(job)


def _landings(upgraded):
    """How the guard landed the task after each failure: (state, reason)."""
    return query(
        upgraded,
        "select to_state, json_extract(data, '$.reason') from events"
        " where kind in ('task.retry_scheduled', 'task.failed') order by id",
    )


def _recorded(upgraded):
    return query(upgraded, "select outcome, refunded from attempts"), query(
        upgraded, "select phase, used from budgets"
    )


def test_an_unavailable_forge_refunds_only_what_spent_no_inference(upgraded, task):
    db, task_id = task

    def review(spent):
        def body(job):
            job.start("script", {})
            job.spent = spent
            raise ForgeUnavailable("POST", "/reviews", 503, "overloaded")

        return body

    for spent in (False, True):
        with pytest.raises(ForgeUnavailable):
            guarded(db, task_id, "review", review(spent), "awaiting_review")
    attempts, budgets = _recorded(upgraded)
    assert attempts == [("unavailable", 1), ("error", 0)]
    assert budgets == [("review", 1)]
    why = "forge request POST /reviews failed: HTTP 503: overloaded"
    assert _landings(upgraded) == [("awaiting_review", why)] * 2


def test_a_failure_before_the_attempt_started_is_recorded_and_counted(upgraded, task):
    db, task_id = task

    def clone(_job):
        raise RuntimeError("the clone URL moved")

    with pytest.raises(RuntimeError):
        guarded(db, task_id, "implementation", clone, "running")
    attempts, budgets = _recorded(upgraded)
    assert attempts == [("error", 0)]
    assert budgets == [("implementation", 1)]
    reason = query(upgraded, "select reason from attempts")[0][0]
    assert reason == "unexpected RuntimeError: the clone URL moved"
    assert _landings(upgraded) == [("ready", reason)]


def test_a_failing_hook_does_not_keep_the_task_from_landing(upgraded, task, caplog):
    # CI's hook posts the terminal `error` status; with the forge away that fails too,
    # and the task must land all the same (else it would wait in awaiting_ci for ever).
    db, task_id = task

    def ci(job):
        job.start(None, {"head": "a" * 40})

        def post_error(reason):
            raise ForgeUnavailable("POST", "/statuses", 503, f"down ({reason})")

        job.failure_hook = post_error
        raise RuntimeError("the runner went away")

    with pytest.raises(RuntimeError):
        guarded(db, task_id, "ci", ci, "awaiting_ci")
    assert _landings(upgraded) == [("awaiting_ci", "unexpected RuntimeError: the runner went away")]
    attempts, _ = _recorded(upgraded)
    assert attempts == [("error", 0)]
    assert "clean-up after ci failed" in caplog.text


def test_a_scope_change_does_not_block_a_failure_but_a_pause_does(task):
    db, task_id = task
    with db.write() as session:
        version = advance(session, task_id, "ready", 1, "claimed", "claim")
        # poll records a new scope: the version moves, the state stays
        advance(session, task_id, "claimed", version, "claimed", "scope", scope_fingerprint="b")
        with pytest.raises(TransitionRefused):
            advance(session, task_id, "claimed", version, "running", "stale")
        moved = advance(
            session, task_id, "claimed", version, "ready", "fail", follow_data_changes=True
        )
        assert moved == version + 2
        advance(session, task_id, "ready", moved, "paused", "withdrawn")
        with pytest.raises(TransitionRefused):
            advance(session, task_id, "ready", moved, "claimed", "late", follow_data_changes=True)


def test_a_recorded_pid_counts_only_while_it_runs_that_tasks_job():
    # This very process is alive but is not `aiworker ... --task 7`: a reused pid.
    assert job_alive(os.getpid(), 7) is False
    assert job_alive(None, 7) is False
    assert job_alive(2**22 + 12345, 7) is False


def test_an_attempt_closed_meanwhile_keeps_its_outcome_and_gets_no_second_event(upgraded, task):
    # An operator's cancel closes the running job's attempt, then stops the job; the
    # job's own ending must not write an attempt.finished that contradicts the record.
    db, task_id = task

    def body(job):
        attempt = job.start("script", {})
        with db.write() as session:
            finish_attempt(session, attempt, "cancelled", reason="cancelled by an operator")
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError):
        guarded(db, task_id, "review", body, "awaiting_review")
    assert query(upgraded, "select outcome, reason from attempts") == [
        ("cancelled", "cancelled by an operator")
    ]
    assert query(upgraded, "select count(*) from events where kind = 'attempt.finished'") == [(0,)]


def test_a_job_queued_for_an_attempt_that_ended_ends_with_it(upgraded, task):
    """A step queued a check for a runner and failed before it waited for it (a signal
    between the two): its attempt ends, and the job, whose delivery nobody will read, ends
    with it instead of waiting for a runner to run it for nobody."""
    from aiworker.store.worker_jobs import enqueue

    db, task_id = task

    def ci(job):
        job.start(None, {})
        enqueue(db, 1, {"contract": "test"}, job.attempt)
        raise RuntimeError("stopped between queueing and waiting")

    with pytest.raises(RuntimeError):
        guarded(db, task_id, "ci", ci, "awaiting_ci")
    [(state, result)] = query(upgraded, "select state, result from worker_jobs")
    assert state == "failed"
    assert "the attempt awaiting it ended as error" in result
