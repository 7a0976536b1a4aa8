"""What a real host's limits do to a job: a provider the kernel kills for its memory, a
check the host cannot start for want of file descriptors. Each is the host's, not the
work's: the task is tried again within its budget, and the reason says what happened."""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.delivery_fixtures import script_installation
from tests.runner_helpers import make_source, request, runner_argv
from tests.test_fault_injection import tick
from tests.test_implement import FIX, query, result_doc


def _kill_when_running(marker: str, stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL the first script agent whose command line holds MARKER (this test's own
    folder), as the kernel's out-of-memory killer would."""
    while not stop.is_set():
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"aiworker.script_agent" in argv and marker.encode() in b" ".join(argv):
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except ProcessLookupError:
                    continue
                killed.append(int(entry.name))
                return
        time.sleep(0.1)


def test_a_kill_from_outside_is_told_from_aiworker_s_kill_of_what_it_left(tmp_path):
    """The out-of-memory killer takes the provider while a child of it (a `git` it runs)
    still holds its output: aiworker kills that child after the drain, and that kill is
    not taken for why the provider ended (it was: "other", a failure never tried again)."""
    import os as _os

    from aiworker.core.phases.run import _killed
    from aiworker.runtime.execution import Limits, run_job

    tag = "AIWORKER_ATTEMPT_ID=killed-from-outside"
    env = {**_os.environ, "AIWORKER_ATTEMPT_ID": "killed-from-outside"}
    outcome = run_job(
        ["sh", "-c", "sleep 30 & kill -KILL $$"],
        cwd=tmp_path,
        env=env,
        limits=Limits(timeout_s=60, drain_timeout_s=0.5),
        tag=tag,
    )
    assert (outcome.signal, outcome.signals_sent) == ("SIGKILL", ["SIGKILL"])  # the child's
    assert outcome.signalled_running is False
    assert _killed(outcome)
    # One aiworker itself stopped (its timeout) is no kill from outside.
    timed_out = run_job(
        ["sleep", "30"],
        cwd=tmp_path,
        env=env,
        limits=Limits(timeout_s=0.5, kill_grace_s=0.5),
        tag=tag,
    )
    assert timed_out.signalled_running is True
    assert not _killed(timed_out)


def test_a_provider_killed_from_outside_is_tried_again_with_the_reason(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    extra = "[scheduler]\nfollow_up = false\n"
    script_installation(
        tmp_path,
        forge,
        monkeypatch,
        extra,
        sleep_s=600,
        edits={"calc.py": FIX},
        result=result_doc(),
    )
    assert cli("poll").exit_code == 0
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_when_running, args=(str(tmp_path), stop, killed))
    killer.start()
    try:
        tick(cli, monkeypatch)
    finally:
        stop.set()
        killer.join()
    assert killed, "the provider never ran"
    [(outcome, reason, refunded)] = query(
        upgraded, "select outcome, reason, refunded from attempts"
    )
    # Before: "script provider exited 137", classed as the provider's own failure, and
    # the task failed for good with two of its three tries unused.
    assert outcome == "transient", reason
    assert "killed by SIGKILL from outside aiworker" in reason
    assert "out-of-memory" in reason
    assert refunded == 0  # inference ran: the try counts against the budget
    assert query(upgraded, "select state from tasks") == [("ready",)]
    assert query(upgraded, "select used from budgets where phase = 'implementation'") == [(1,)]


def _short_of_descriptors(tmp_path: Path) -> dict:
    """What `runner execute` reports when its host cannot start ./ci/run for want of file
    descriptors: the lowest limit it still starts under, found by trying."""
    source = make_source(tmp_path, "echo hello\n")
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    argv = shlex.join(runner_argv(tmp_path, attempts))
    for limit in range(16, 5, -1):
        ran = subprocess.run(
            ["sh", "-c", f"ulimit -n {limit} && exec {argv}"],
            input=json.dumps(request(source)).encode(),
            capture_output=True,
            check=False,
        )
        try:
            document = json.loads(ran.stdout)
        except ValueError:
            continue  # too few even to start the runner
        if document.get("spawn_error"):
            return document
    raise AssertionError("no limit left the runner started and its check not")


def test_a_check_the_host_cannot_start_is_the_hosts_failure(upgraded, state_dir, tmp_path):
    from aiworker.config.models import Runners
    from aiworker.core.runner.dispatch import Dispatch
    from aiworker.core.runner.fleet import accept
    from aiworker.errors import EXIT_UNAVAILABLE, ShortOfResources
    from aiworker.runtime.gitcache import GitCache
    from aiworker.store.engine import Database
    from aiworker.store.worker_jobs import claim, enqueue

    document = _short_of_descriptors(tmp_path)
    assert (document["status"], document["spawn_error"]) == (
        "command_failed",
        os.strerror(errno.EMFILE),
    )
    # The controller receives it as a fleet runner delivers it.
    db = Database(f"sqlite:///{upgraded}")
    job = {**request("unused"), "label": document["label"], "suite_id": document["suite_id"]}
    pair = (1, enqueue(db, 1, job))
    lease = claim(db, "runner-a", "key-1", lease_for=timedelta(seconds=60), max_attempts=3)
    assert lease is not None
    accept(db, pair, lease.token, "complete", {"result": document})
    dispatch = Dispatch(db, GitCache(state_dir), state_dir, Runners(), {1: "team/app"})
    with pytest.raises(ShortOfResources) as raised:
        dispatch.delivered(pair)
    db.dispose()
    # Before: a red check, which the gate blamed on the agent (and CI on the work).
    assert raised.value.exit_code == EXIT_UNAVAILABLE
    assert "runner runner-a could not start the check (Too many open files)" in str(raised.value)
    assert "raise its limits" in str(raised.value)


def test_a_command_short_of_descriptors_says_so_and_exits_75(upgraded, state_dir, tmp_path):
    """At every limit too low for it, `status` says the host is short and exits 75 (try
    again), never 2 (the configuration or the store is invalid) nor an unexpected error."""
    config = tmp_path / "config.toml"
    config.write_text("check_interval = 60\n")
    argv = [sys.executable, "-m", "aiworker", "--json", "--config", str(config)]
    argv += ["--state-dir", str(state_dir), "status"]
    answers = set()
    for limit in range(4, 24):
        ran = subprocess.run(
            ["sh", "-c", f"ulimit -n {limit} && exec {shlex.join(argv)}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if "Fatal Python error" in ran.stderr:
            continue  # too few for the interpreter itself
        if ran.returncode == 0:
            answers.add("ok")
            continue
        error = json.loads(ran.stderr or ran.stdout)["error"]
        assert (ran.returncode, error["code"]) == (75, "short_of_resources"), (limit, ran)
        assert "raise its limits" in error["message"]
        answers.add("short")
    assert answers == {"ok", "short"}
