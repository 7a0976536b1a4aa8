"""The controller's side of a runner fleet (`runners.mode = "fleet"`): an implemented
task's checks and its CI run on a `runner serve` that claims them from the controller's
runner listener; a CI step stopped while it waits for a runner ends its job, so that no
runner runs it later for nobody, and its snapshot goes; one killed outright has its job
ended by the recovery of its attempt."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys

from aiworker.core.runner.snapshots import published
from tests.delivery_fixtures import write_scenario
from tests.fleet_fixtures import TOKEN, runner_argv, runner_env, runner_listener, stop
from tests.helpers import run_process
from tests.test_artifact_transfers import wait_for
from tests.test_delivery import REVIEW_OK
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc

WAITING = "select state from worker_jobs where state = 'queued'"
EVERY = "select state, worker_id, result from worker_jobs order by worker_job_index"


def fleet_runner(url: str, attempts):
    argv = runner_argv("serve", "--server", url, "--worker-id", "r1")
    return subprocess.Popen(
        [*argv, "--attempt-root", str(attempts)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=runner_env(),
    )


@contextlib.contextmanager
def published_on_a_fleet(claimed, tmp_path):
    """A task implemented and published with its checks run by a fleet runner, which is
    gone again; the controller's runner listener, and the task."""
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc(), phases={})
    write_scenario(tmp_path / "scenario.json", edits={"calc.py": FIX}, result=result_doc(),
                   phases={"review": REVIEW_OK})  # fmt: skip
    token_file = tmp_path / "runner.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    config = tmp_path / "config.toml"
    config.write_text(
        config.read_text() + '[runners]\nmode = "fleet"\nqueue_seconds = 600\n'
        f'tokens = [{{token_file = "{token_file}"}}]\n'
    )
    with runner_listener() as listener:
        runner = fleet_runner(listener.url, tmp_path / "attempts")
        try:
            implemented = run_process("--json", "implement", "--task", str(task), "--slot", "1")
            assert implemented.exit_code == 0, implemented
            assert run_process("publish", "--task", str(task)).exit_code == 0
        finally:
            stop(runner)
        yield listener, task, implemented.json()["head"]


def killed_while_waiting(db_file, task: int) -> None:
    """A CI step of TASK waits for a runner and is killed outright: nothing of it runs to
    end the job it queued."""
    ci = subprocess.Popen(
        [sys.executable, "-m", "aiworker", "ci", "--task", str(task)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: query(db_file, WAITING) == [("queued",)], 120, "the CI job queued")
    ci.kill()
    ci.wait(timeout=60)
    assert query(db_file, EVERY)[-1][0] == "queued"


def test_ci_waits_for_the_fleet_and_a_stopped_wait_ends_its_job(
    forge, claimed, upgraded, tmp_path, state_dir
):
    with published_on_a_fleet(claimed, tmp_path) as (listener, task, head):
        # No runner now: the CI step waits for one, and is stopped as systemd stops it.
        ci = subprocess.Popen(
            [sys.executable, "-m", "aiworker", "--json", "ci", "--task", str(task)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: query(upgraded, WAITING) == [("queued",)], 120, "the CI job queued")
        ci.send_signal(signal.SIGTERM)
        _out, err = ci.communicate(timeout=120)
        assert ci.returncode != 0, err
        [(state, result)] = query(
            upgraded, "select state, result from worker_jobs order by worker_job_index desc limit 1"
        )
        assert state == "failed"
        assert "the controller stopped waiting for it: stopped by SIGTERM" in result
        assert published(state_dir, 1) == set()  # its snapshot went with it
        shown = run_process("--json", "task", "show", str(task)).json()
        assert shown["state"] == "awaiting_ci"
        assert shown["attempts"][-1]["outcome"] == "interrupted"
        [pending] = forge.client("worker-bot").combined_status("team", "app", head).statuses
        assert pending.status == "error"
        assert "stopped by SIGTERM" in pending.description
        # Waiting again, it is killed outright: the recovery of its attempt ends its job.
        killed_while_waiting(upgraded, task)
        jobs = query(upgraded, EVERY)
        # The next CI run first recovers the dead attempt, which ends the job it awaited;
        # then a runner comes back, and the new job is the only one it runs.
        ci = subprocess.Popen(
            [sys.executable, "-m", "aiworker", "--json", "ci", "--task", str(task)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: len(query(upgraded, EVERY)) == len(jobs) + 1, 120, "the next job")
            runner = fleet_runner(listener.url, tmp_path / "attempts")
            try:
                out, _ = ci.communicate(timeout=300)
            finally:
                stop(runner)
        finally:
            ci.kill()
    assert ci.returncode == 0, out
    assert json.loads(out)["state"] == "success"
    jobs = query(upgraded, EVERY)
    assert [job[:2] for job in jobs[-3:]] == [
        ("failed", None),
        ("failed", None),
        ("succeeded", "r1"),
    ]
    assert "the attempt awaiting it was abandoned: the job's process died" in jobs[-2][2]


def test_a_cancel_ends_the_job_a_killed_ci_step_waited_for(claimed, upgraded, tmp_path):
    """The task is cancelled after its CI step was killed waiting for a runner: the job it
    queued ends with the cancel: no runner runs it later for nobody."""
    with published_on_a_fleet(claimed, tmp_path) as (_listener, task, _head):
        killed_while_waiting(upgraded, task)
        cancelled = run_process("--json", "task", "cancel", str(task))
        assert cancelled.exit_code == 0, cancelled
        assert cancelled.json()["attempts_closed"], cancelled.json()
        state, _worker, result = query(upgraded, EVERY)[-1]
        assert state == "failed"
        assert f"task {task} was cancelled" in result
