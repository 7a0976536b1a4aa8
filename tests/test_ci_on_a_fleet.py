"""The controller's side of a runner fleet (`runners.mode = "fleet"`): an implemented
task's checks and its CI run on a `runner serve` that claims them from the controller's
runner listener; a CI step stopped while it waits for a runner ends its job, so that no
runner runs it later for nobody, and its snapshot goes."""

from __future__ import annotations

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


def fleet_runner(url: str, attempts):
    argv = runner_argv("serve", "--server", url, "--worker-id", "r1")
    return subprocess.Popen(
        [*argv, "--attempt-root", str(attempts)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=runner_env(),
    )


def test_ci_waits_for_the_fleet_and_a_stopped_wait_ends_its_job(
    forge, claimed, upgraded, tmp_path, state_dir
):
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
        # No runner now: the CI step waits for one, and is stopped as systemd stops it.
        ci = subprocess.Popen(
            [sys.executable, "-m", "aiworker", "--json", "ci", "--task", str(task)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        waiting = "select state from worker_jobs where state = 'queued'"
        wait_for(lambda: query(upgraded, waiting) == [("queued",)], 120, "the CI job queued")
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
        head = implemented.json()["head"]
        [pending] = forge.client("worker-bot").combined_status("team", "app", head).statuses
        assert pending.status == "error"
        assert "stopped by SIGTERM" in pending.description
        # A runner comes back: the next CI run is the only job it runs.
        runner = fleet_runner(listener.url, tmp_path / "attempts")
        try:
            passed = run_process("--json", "ci", "--task", str(task))
        finally:
            stop(runner)
    assert passed.exit_code == 0, passed
    assert passed.json()["state"] == "success"
    jobs = query(upgraded, "select state, worker_id from worker_jobs order by worker_job_index")
    assert jobs[-2:] == [("failed", None), ("succeeded", "r1")]
