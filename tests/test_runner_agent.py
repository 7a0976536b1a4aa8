"""`aiworker runner serve | run-job | doctor` against the controller's runner listener, as
real processes: a job's exact snapshot is fetched and checked, ./ci/run runs, and the
delivery (`ait.runner.delivery.v1`) carries digests of exactly what it printed; hostile
snapshots fail the job before anything runs; a lost lease ends the job with nothing
delivered; a lost reply to `complete` is retried and "already finished" is final;
SIGTERM lets the running job finish."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from aiworker.core.runner.snapshots import MANIFEST, publish, snapshot_dir
from aiworker.store.engine import Database
from aiworker.store.worker_job_records import abandon, get_job
from tests.fleet_fixtures import (
    TOKEN,
    commit_tree,
    queue_job,
    runner_argv,
    runner_env,
    runner_listener,
    write_config,
)
from tests.forge_fixtures import git

RUN = '#!/bin/sh\necho "hello $1"\nexit "${2:-0}"\n'


@pytest.fixture
def controller(upgraded, tmp_path, monkeypatch, state_dir):
    monkeypatch.setenv("AIWORKER_CONFIG", str(write_config(tmp_path, lease_seconds=5)))
    repo = tmp_path / "repo"
    commit_tree(repo, {"ci/run": RUN, "README": "x\n"})
    db = Database(f"sqlite:///{upgraded}")
    with runner_listener() as (_process, url, _operator):
        yield db, url, repo
    db.dispose()


def run(argv, token=None, timeout=60):
    env = runner_env() if token is None else {**runner_env(), "AIWORKER_SERVER_TOKEN": token}
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def serve(url, *args, attempt_root, timeout=60):
    argv = runner_argv("serve", "--server", url, "--attempt-root", str(attempt_root), *args)
    return run(argv, timeout=timeout)


def stdout_of(db, pair):
    delivery = get_job(db, pair).result
    return delivery, delivery["result"]["evidence"]["stdout"]


def test_serve_once_runs_the_exact_snapshot_and_delivers_digests_of_the_stream(
    controller, state_dir, tmp_path
):
    db, url, repo = controller
    index = queue_job(db, state_dir, repo, 1, ("./ci/run", "world"))
    attempts = tmp_path / "attempts"
    done = serve(url, "--worker-id", "r1", "--once", attempt_root=attempts)
    assert done.returncode == 0, done.stderr
    [job] = json.loads(done.stdout)["jobs"]
    assert (job["delivered"], job["status"], job["attempt"]) == ("complete", "succeeded", 1)
    delivery, stdout = stdout_of(db, (1, index))
    assert delivery["contract"] == "ait.runner.delivery.v1"
    assert (delivery["worker_id"], delivery["outcome"]) == ("r1", "completed")
    assert stdout["sha256"] == hashlib.sha256(b"hello world\n").hexdigest()
    assert get_job(db, (1, index)).state == "succeeded"
    # Nothing of the attempt is left behind.
    assert [p.name for p in attempts.iterdir()] == [".runner.lock"]


def test_a_red_check_is_delivered_with_its_exit_and_serve_once_says_so(
    controller, state_dir, tmp_path
):
    db, url, repo = controller
    index = queue_job(db, state_dir, repo, 1, ("./ci/run", "red", "3"))
    done = serve(url, "--worker-id", "r1", "--once", attempt_root=tmp_path / "a")
    assert done.returncode == 1
    delivery, _ = stdout_of(db, (1, index))
    assert (delivery["result"]["status"], delivery["result"]["exit_code"]) == ("command_failed", 3)


def test_a_hostile_snapshot_fails_the_job_before_anything_runs(controller, state_dir, tmp_path):
    db, url, _ = controller
    marker = tmp_path / "ran"
    repo = tmp_path / "hostile"
    commit_tree(repo, {"ci/run": f"#!/bin/sh\ntouch {marker}\n"})
    index = queue_job(db, state_dir, repo, 1)
    snapshot = get_job(db, (1, index)).request["source"]["snapshot_id"]
    manifest_path = snapshot_dir(state_dir, 1, snapshot) / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["trees"][snapshot][0]["name"] = ".."
    manifest_path.write_text(json.dumps(manifest))
    done = serve(url, "--worker-id", "r1", "--once", attempt_root=tmp_path / "a")
    assert done.returncode == 1
    delivery = get_job(db, (1, index)).result
    assert (delivery["outcome"], delivery["error"]["code"]) == ("failed", "snapshot_path_escape")
    assert not marker.exists()


def test_run_job_claims_exactly_its_pair_and_checks_the_request(controller, state_dir, tmp_path):
    db, url, repo = controller
    first = queue_job(db, state_dir, repo, 1, ("./ci/run", "one"))
    second = queue_job(db, state_dir, repo, 1, ("./ci/run", "two"))
    mismatched = queue_job(db, state_dir, repo, 2, source_index=1)

    def run_job(index, job):
        argv = runner_argv(
            "run-job",
            "--server",
            url,
            "--repository-index",
            str(index),
            "--worker-job-index",
            str(job),
            "--attempt-root",
            str(tmp_path / "a"),
        )
        return run(argv)

    assert run_job(1, second).returncode == 0
    assert get_job(db, (1, first)).state == "queued"
    _, stdout = stdout_of(db, (1, second))
    assert stdout["sha256"] == hashlib.sha256(b"hello two\n").hexdigest()
    again = run_job(1, second)
    assert again.returncode == 1
    assert json.loads(again.stdout)["error"]["code"] == "not_claimable"
    assert run_job(2, mismatched).returncode == 1
    assert get_job(db, (2, mismatched)).result["error"]["code"] == "repository_mismatch"


def test_doctor_proves_the_path_and_claims_nothing(controller, state_dir, tmp_path):
    db, url, repo = controller
    index = queue_job(db, state_dir, repo, 1)
    argv = runner_argv("doctor", "--server", url, "--attempt-root", str(tmp_path / "a"))
    good = run(argv, timeout=30)
    assert good.returncode == 0, good.stdout
    assert {c["name"] for c in json.loads(good.stdout)["checks"]} == {
        "controller",
        "contract",
        "clock",
        "attempt_root",
        "containment",
        "privileges",
    }
    assert get_job(db, (1, index)).state == "queued"
    wrong = run(argv, token="x")
    assert wrong.returncode == 1
    assert "not accepted" in wrong.stdout
    missing = run(argv, token="")
    assert missing.returncode == 2
    assert "AIWORKER_SERVER_TOKEN" in missing.stdout
    non_ascii = run(argv, token="canary-runner-token-12345678901234\u2603")
    assert non_ascii.returncode == 2, non_ascii.stdout
    assert "AIWORKER_SERVER_TOKEN is malformed" in non_ascii.stdout
    assert "canary-runner-token" not in non_ascii.stdout + non_ascii.stderr
    bad_url = argv.copy()
    bad_url[bad_url.index(url)] = "ftp://host"
    assert run(bad_url).returncode == 2
    # A controller that accepts connections but never answers: doctor gives up on it
    # (its calls have a 4 s deadline) and says so, rather than hanging.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        hung = argv.copy()
        hung[hung.index(url)] = f"http://127.0.0.1:{silent.getsockname()[1]}"
        stuck = run(hung, timeout=30)
    assert stuck.returncode == 1
    [controller] = [c for c in json.loads(stuck.stdout)["checks"] if c["name"] == "controller"]
    assert controller["status"] == "fail"


def test_doctor_warns_where_a_job_cannot_get_a_cgroup_of_its_own(controller, tmp_path):
    """Where no cgroup can be made for a job (here the cgroup2 hierarchy mounted
    read-only, as in a container that delegates none), doctor warns that a process a job
    detaches may outlive it; as root on this host, each job gets one."""
    import shlex
    import shutil

    from aiworker.runtime.cgroups import cgroup2_mount

    mount = cgroup2_mount()
    if os.geteuid() != 0 or mount is None or shutil.which("unshare") is None:
        pytest.skip("needs root, a cgroup2 hierarchy and unshare")
    _, url, _ = controller
    argv = runner_argv("doctor", "--server", url, "--attempt-root", str(tmp_path / "a"))

    def containment(done):
        assert done.returncode == 0, done.stdout + done.stderr  # a warning fails nothing
        [check] = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "containment"]
        return check["status"], check["detail"]

    assert containment(run(argv)) == (
        "ok",
        "each job runs in a cgroup of its own, killed whole",
    )
    read_only = f"mount -o remount,bind,ro {shlex.quote(str(mount))} && exec {shlex.join(argv)}"
    status, detail = containment(run(["unshare", "-m", "sh", "-c", read_only]))
    assert status == "warn"
    assert detail.startswith("no cgroup can be made for a job here (cgroup2 is not mounted")
    assert "a process a job detaches (setsid, a double fork) may outlive it" in detail


def test_serve_refuses_a_wrong_token_without_retrying(controller, tmp_path):
    _, url, _ = controller
    argv = runner_argv("serve", "--server", url, "--worker-id", "r1")
    argv += ["--attempt-root", str(tmp_path / "a")]
    refused = run(argv, token="guess", timeout=30)
    assert refused.returncode == 77, refused
    # A retry would say "controller unreachable (...); again in N s" first (serve.py);
    # not timed: on a loaded machine one refused request may itself take seconds.
    assert "again in" not in refused.stderr, refused.stderr
    assert "unreachable" not in refused.stderr, refused.stderr


def start_serve(url, attempt_root, *args):
    argv = runner_argv("serve", "--server", url, "--worker-id", "r1")
    argv += ["--attempt-root", str(attempt_root), "--heartbeat-interval-ms", "200", *args]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=runner_env()
    )


def wait_for(predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_sigterm_lets_the_running_job_finish_and_a_second_serve_is_refused(
    controller, state_dir, tmp_path
):
    db, url, _ = controller
    repo = tmp_path / "slow"
    commit_tree(repo, {"ci/run": "#!/bin/sh\nsleep 2\necho slept\n"})
    index = queue_job(db, state_dir, repo, 1)
    attempts = tmp_path / "a"
    runner = start_serve(url, attempts)
    try:
        wait_for(lambda: get_job(db, (1, index)).state == "leased")
        second = serve(url, "--worker-id", "r2", "--once", attempt_root=attempts)
        assert second.returncode == 75
        assert "another runner" in second.stdout
        runner.send_signal(signal.SIGTERM)
        out, _ = runner.communicate(timeout=30)
    finally:
        runner.kill()
    assert runner.returncode == 0
    assert json.loads(out)["jobs"][0]["delivered"] == "complete"
    _, stdout = stdout_of(db, (1, index))
    assert stdout["sha256"] == hashlib.sha256(b"slept\n").hexdigest()


def test_a_lost_lease_ends_the_job_and_nothing_is_delivered(controller, state_dir, tmp_path):
    db, url, _ = controller
    repo = tmp_path / "long"
    commit_tree(repo, {"ci/run": "#!/bin/sh\nsleep 60\n"})
    index = queue_job(db, state_dir, repo, 1)
    runner = start_serve(url, tmp_path / "a", "--once")
    try:
        wait_for(lambda: get_job(db, (1, index)).state == "leased")
        time.sleep(0.5)
        abandon(db, (1, index), {"error": "cancelled by the operator"})
        started = time.monotonic()
        out, _ = runner.communicate(timeout=30)
    finally:
        runner.kill()
    assert time.monotonic() - started < 15
    assert json.loads(out)["jobs"][0]["delivered"] == "lease_lost"
    assert get_job(db, (1, index)).result == {"error": "cancelled by the operator"}


def test_a_runner_frozen_past_its_lease_with_nobody_taking_over_delivers_its_job(
    controller, state_dir, tmp_path
):
    """The runner's host freezes (SIGSTOP here; a hypervisor's pause, a starved machine)
    for longer than the lease while its job runs to the end, and no runner takes the job
    over meanwhile: on waking, the controller still holds the lease for it, so the job's
    result is delivered, not thrown away as lease_lost (in the embedded runner that loss
    ran the model again)."""
    db, url, _ = controller  # lease_seconds = 5
    repo = tmp_path / "frozen"
    commit_tree(repo, {"ci/run": "#!/bin/sh\nsleep 2\necho finished while frozen\n"})
    index = queue_job(db, state_dir, repo, 1)
    runner = start_serve(url, tmp_path / "a", "--once")
    try:
        wait_for(lambda: get_job(db, (1, index)).state == "leased")
        time.sleep(0.5)
        runner.send_signal(signal.SIGSTOP)
        time.sleep(9)  # the lease (5 s) runs out on both clocks; the job's child finishes
        runner.send_signal(signal.SIGCONT)
        out, err = runner.communicate(timeout=60)
    finally:
        runner.kill()
    assert json.loads(out)["jobs"][0]["delivered"] == "complete", err
    assert "the lease was renewed late (this host stalled)" in err
    job = get_job(db, (1, index))
    assert (job.state, job.attempt) == ("succeeded", 1)
    _, stdout = stdout_of(db, (1, index))
    assert stdout["sha256"] == hashlib.sha256(b"finished while frozen\n").hexdigest()


def test_a_lost_reply_to_complete_is_retried_and_already_finished_is_final(
    upgraded, tmp_path, monkeypatch, state_dir
):
    monkeypatch.setenv("AIWORKER_CONFIG", str(write_config(tmp_path)))
    repo = tmp_path / "repo"
    commit_tree(repo, {"ci/run": RUN})
    db = Database(f"sqlite:///{upgraded}")
    index = queue_job(db, state_dir, repo, 1, ("./ci/run", "once"))
    lost = {"AIWORKER_FAILPOINT": "runner_api.after_finish:raise"}
    with runner_listener(env=lost) as (_process, url, _operator):
        done = serve(url, "--worker-id", "r1", "--once", attempt_root=tmp_path / "a")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs"][0]["delivered"] == "complete"
    job = get_job(db, (1, index))
    assert (job.state, job.attempt) == ("succeeded", 1)
    db.dispose()


def test_a_job_that_prints_a_lot_is_delivered_with_the_digest_of_every_byte(
    controller, state_dir, tmp_path
):
    db, url, _ = controller
    repo = tmp_path / "loud"
    commit_tree(repo, {"ci/run": "#!/bin/sh\nhead -c 300000 /dev/zero | tr '\\0' x\n"})
    index = queue_job(db, state_dir, repo, 1)
    done = serve(url, "--worker-id", "r1", "--once", attempt_root=tmp_path / "a")
    assert done.returncode == 0, done.stdout + done.stderr
    _, stdout = stdout_of(db, (1, index))
    assert stdout["total_bytes"] == 300_000
    assert stdout["sha256"] == hashlib.sha256(b"x" * 300_000).hexdigest()
    assert stdout["truncated"]


def test_a_snapshot_is_served_only_to_the_lease_of_a_job_that_names_it(
    controller, state_dir, tmp_path
):
    db, url, repo = controller
    index = queue_job(db, state_dir, repo, 1)
    snapshot = get_job(db, (1, index)).request["source"]["snapshot_id"]
    path = f"{url}/api/runner/v1/snapshots/1/{snapshot}/manifest.json"
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def fetch(lease=None):
        sent = {**headers, "X-Aiworker-Lease": lease} if lease else headers
        return requests.get(path, headers=sent, timeout=10).status_code

    assert fetch() == 404  # queued: no lease names it
    claimed = requests.post(
        f"{url}/api/runner/v1/claim",
        json={"worker_id": "r1", "request_key": "k"},
        headers=headers,
        timeout=10,
    ).json()
    # The token alone, or another lease's proof, reaches nothing; this lease does.
    assert (fetch(), fetch("f" * 32), fetch(claimed["lease_token"])) == (404, 404, 200)
    # Handed back unstarted: queued again at once (the attempt counts), the snapshot closed.
    pair = f"{claimed['repository_index']}/{claimed['worker_job_index']}"
    released = requests.post(
        f"{url}/api/runner/v1/jobs/{pair}/release",
        json={"lease_token": claimed["lease_token"]},
        headers=headers,
        timeout=10,
    )
    assert released.json() == {"released": True}
    job = get_job(db, (1, index))
    assert (job.state, job.attempt) == ("queued", 1)
    assert fetch(claimed["lease_token"]) == 404


def test_a_revoked_token_ends_the_running_job_and_nothing_is_delivered(
    controller, state_dir, tmp_path
):
    db, url, _ = controller
    repo = tmp_path / "long"
    commit_tree(repo, {"ci/run": '#!/bin/sh\necho $$ > "$PIDFILE"\nexec sleep 60\n'})
    pidfile = tmp_path / "job.pid"
    index = queue_job(db, state_dir, repo, 1, environment={"PIDFILE": str(pidfile)})
    runner = start_serve(url, tmp_path / "a", "--once")
    try:
        wait_for(pidfile.exists)
        (tmp_path / "runner.token").write_text("a-different-token-of-at-least-32-characters\n")
        out, _ = runner.communicate(timeout=30)
    finally:
        runner.kill()
    assert json.loads(out)["jobs"][0]["delivered"] == "lease_lost"
    pid = int(pidfile.read_text())
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid), 10)
    assert get_job(db, (1, index)).state == "leased"  # its lease runs out; then again


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] == "Z"
    except FileNotFoundError:
        return True


def test_sigterm_while_waiting_for_work_or_for_the_controller_stops_at_once(controller, tmp_path):
    _, url, _ = controller
    for server, waiting in ((url, "serving"), ("http://127.0.0.1:9", "unreachable")):
        argv = runner_argv("serve", "--server", server, "--worker-id", "r1")
        argv[argv.index("--json")] = "--verbose"  # its log says when it waits
        argv += ["--attempt-root", str(tmp_path / "a")]
        runner = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=runner_env()
        )
        try:
            while waiting not in (line := runner.stderr.readline()):
                assert line, "the runner ended before it waited"
            time.sleep(0.5)
            runner.send_signal(signal.SIGTERM)
            runner.communicate(timeout=20)
        finally:
            runner.kill()
        assert runner.returncode == 0


def test_a_locked_external_tree_comes_from_its_own_snapshot(controller, state_dir, tmp_path):
    db, url, _ = controller
    library = tmp_path / "library"
    commit_tree(library, {"lib.py": "x = 1\n"})
    head = subprocess.run(
        ["git", "-C", str(library), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    library_snapshot = publish(state_dir, library, 2, "HEAD")
    app = tmp_path / "app"
    commit_tree(app, {"ci/run": "#!/bin/sh\ncat vendor/lib/lib.py\n"})
    git("update-index", "--add", "--cacheinfo", f"160000,{head},vendor/lib", cwd=app)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "sub", cwd=app)
    index = queue_job(db, state_dir, app, 1, external={"vendor/lib": f"2:{library_snapshot}"})
    done = serve(url, "--worker-id", "r1", "--once", attempt_root=tmp_path / "a")
    assert done.returncode == 0, done.stdout + done.stderr
    _, stdout = stdout_of(db, (1, index))
    assert stdout["sha256"] == hashlib.sha256(b"x = 1\n").hexdigest()


CONTROLLER_MODULES = ("sqlalchemy", "alembic", "aiworker.store", "aiworker.core.phases")


def loaded_modules(stderr: str) -> set[str]:
    """The modules a command loaded, from `python -X importtime` (every first import)."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_a_runner_host_loads_neither_the_store_nor_sqlalchemy_nor_the_phases(
    controller, state_dir, tmp_path
):
    """A runner host may lack the controller's database driver and need not pay for its
    import: each runner command, doing its real work, loads none of the controller's."""
    db, url, repo = controller
    serve_job = queue_job(db, state_dir, repo, 1, ("./ci/run", "serve"))
    doctor = runner_argv("doctor", "--server", url, "--attempt-root", str(tmp_path / "a"))
    serve_once = runner_argv("serve", "--server", url, "--worker-id", "r1", "--once")
    serve_once += ["--attempt-root", str(tmp_path / "a")]
    commands = {"doctor": doctor, "serve": serve_once}
    for name, argv in commands.items():
        done = run([argv[0], "-X", "importtime", *argv[1:]])
        assert done.returncode == 0, (name, done.stdout, done.stderr[-2000:])
        loaded = loaded_modules(done.stderr)
        assert "aiworker.core.runner.agent" in loaded or name == "doctor", name
        leaked = sorted(m for m in loaded if m.startswith(CONTROLLER_MODULES))
        assert leaked == [], (name, leaked)
    assert get_job(db, (1, serve_job)).state == "succeeded"
    run_job_index = queue_job(db, state_dir, repo, 1, ("./ci/run", "run-job"))
    run_job = runner_argv("run-job", "--server", url, "--repository-index", "1")
    run_job += ["--worker-job-index", str(run_job_index), "--attempt-root", str(tmp_path / "a")]
    source = tmp_path / "source"
    commit_tree(source, {"ci/run": RUN})
    request = {
        "contract": "ait.runner.native-job.v3",
        "label": "local",
        "source": {"kind": "local_directory", "path": str(source)},
        "command": {"argv": ["./ci/run", "execute"]},
        "timeout_ms": 60_000,
        "suite_id": "local",
    }
    execute = runner_argv("execute", "--source-root", str(tmp_path))
    execute += ["--attempt-root", str(tmp_path / "x")]
    for name, argv, stdin in (("run-job", run_job, None), ("execute", execute, request)):
        done = subprocess.run(
            [argv[0], "-X", "importtime", *argv[1:]],
            input=json.dumps(stdin) if stdin else None,
            capture_output=True,
            text=True,
            env=runner_env(),
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, (name, done.stdout, done.stderr[-2000:])
        loaded = loaded_modules(done.stderr)
        leaked = sorted(m for m in loaded if m.startswith(CONTROLLER_MODULES))
        assert leaked == [], (name, leaked)
        if name == "execute":
            # Its request is checked against the contract's JSON Schema, not a pydantic
            # model: pydantic's import alone is more than a runner's start-up budget.
            assert "aiworker.contracts.jsonshape" in loaded
            assert sorted(m for m in loaded if m.startswith("pydantic")) == []
    assert get_job(db, (1, run_job_index)).state == "succeeded"


def test_an_attempt_root_that_is_a_file_is_named_with_exit_2(tmp_path):
    """A runner host's operator points --attempt-root at a file: named (it was an
    unexpected FileExistsError, exit 1), before the controller is asked for anything."""
    file = tmp_path / "attempts"
    file.write_text("x\n")
    argv = runner_argv("serve", "--server", "http://127.0.0.1:9", "--worker-id", "r1", "--once")
    done = run([*argv, "--attempt-root", str(file)])
    assert done.returncode == 2, (done.stdout, done.stderr)
    message = json.loads(done.stdout)["error"]["message"]
    assert message == f"--attempt-root {file}: exists and is not a directory"
    assert file.read_text() == "x\n"


def test_a_source_root_that_is_no_directory_is_named_with_exit_2(tmp_path):
    argv = runner_argv("serve", "--server", "http://127.0.0.1:9", "--worker-id", "r1", "--once")
    done = run([*argv, "--source-root", str(tmp_path / "missing")])
    assert done.returncode == 2, (done.stdout, done.stderr)
    message = json.loads(done.stdout)["error"]["message"]
    assert message == f"--source-root {tmp_path / 'missing'}: no such directory"


def test_a_runner_started_before_its_controller_says_why_it_waits_and_when_it_connects(
    upgraded, tmp_path, monkeypatch, state_dir
):
    """Started first (a fleet host booting before the controller's): the runner says in
    an operator's words why it waits, connects once the listener is up and says so, and
    runs the job; pointed at another service it says that is not the runner API."""
    monkeypatch.setenv("AIWORKER_CONFIG", str(write_config(tmp_path, lease_seconds=30)))
    repo = tmp_path / "repo"
    commit_tree(repo, {"ci/run": RUN})
    db = Database(f"sqlite:///{upgraded}")
    index = queue_job(db, state_dir, repo, 1, ("./ci/run", "late"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        listen = f"127.0.0.1:{probe.getsockname()[1]}"
    argv = runner_argv("serve", "--server", f"http://{listen}", "--worker-id", "r1")
    argv[argv.index("--json")] = "--verbose"
    argv += ["--attempt-root", str(tmp_path / "a")]
    runner = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=runner_env()
    )
    try:
        first = runner.stderr.readline()
        assert "health: connection refused (nothing listens there)" in first, first
        with runner_listener(listen) as listener:
            while "controller reachable after" not in (line := runner.stderr.readline()):
                assert line, "the runner ended before it connected"
            wait_for(lambda: get_job(db, (1, index)).state == "succeeded", 120)
            # The operator's listener is not the runner API, and the runner says so.
            wrong = run(runner_argv("doctor", "--server", listener.operator), timeout=60)
        runner.send_signal(signal.SIGTERM)
        runner.communicate(timeout=60)
    finally:
        runner.kill()
    assert runner.returncode == 0
    [check] = [c for c in json.loads(wrong.stdout)["checks"] if c["name"] == "controller"]
    assert (check["status"], check["detail"]) == (
        "fail",
        "this is the operator's listener; a runner's is `web serve --runner-listen`",
    )
    # Some other service (here Python's file server) answers 404 its own way.
    other = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", listen.split(":")[1]],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: b"200" in _get(f"http://{listen}/"), 30)
        foreign = run(runner_argv("doctor", "--server", f"http://{listen}"), timeout=60)
    finally:
        other.kill()
        other.wait()
    [check] = [c for c in json.loads(foreign.stdout)["checks"] if c["name"] == "controller"]
    assert check["detail"] == (
        f"http://{listen}/api/runner/v1/health: HTTP 404 that is not from aiworker's runner "
        "API (is --server the address `web serve --runner-listen` gives?)"
    )
    db.dispose()


def _get(url: str) -> bytes:
    try:
        return f"{requests.get(url, timeout=5).status_code}".encode()
    except requests.RequestException:
        return b""


@pytest.mark.skipif(os.geteuid() != 0, reason="a runner as root: its jobs may read its process")
def test_a_job_that_reads_the_runner_s_token_gets_it_masked_in_its_evidence(
    controller, state_dir, tmp_path
):
    """A runner run as root runs its jobs as root, which may read its environment from
    /proc despite its being undumpable: what a job prints of the token is masked in the
    evidence it delivers, as every secret is, and never stored."""
    db, url, _ = controller
    repo = tmp_path / "reader"
    reader = '#!/bin/sh\ntr "\\0" "\\n" < /proc/$PPID/environ | grep AIWORKER_SERVER_TOKEN\n'
    commit_tree(repo, {"ci/run": reader})
    index = queue_job(db, state_dir, repo, 1)
    done = serve(url, "--worker-id", "r1", "--once", attempt_root=tmp_path / "a")
    assert done.returncode == 0, done.stderr
    _, stdout = stdout_of(db, (1, index))
    assert stdout["masked"] is True
    assert base64.b64decode(stdout["tail_base64"]) == b"AIWORKER_SERVER_TOKEN=***\n"
    assert TOKEN not in json.dumps(get_job(db, (1, index)).result)
    # Its doctor says so; without CAP_SYS_PTRACE (its unit has none), a job cannot.
    argv = runner_argv("doctor", "--server", url, "--attempt-root", str(tmp_path / "d"))

    def privileges(done):
        assert done.returncode == 0, done.stdout + done.stderr  # a warning fails nothing
        [check] = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "privileges"]
        return check["status"], check["detail"]

    status, detail = privileges(run(argv))
    assert status == "warn"
    assert detail.startswith("runs as root with CAP_SYS_PTRACE: its jobs run so too")
    dropped = ["setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-all", *argv]
    assert privileges(run(dropped)) == ("ok", "its jobs cannot read its token from its process")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_runner_whose_attempt_root_is_full_hands_its_jobs_back_and_waits_for_room(
    controller, state_dir, tmp_path
):
    """The runner's attempt root fills up (a job left a cache behind, another tenant): a
    job it cannot even lay out is handed back, not failed, and the runner waits before it
    claims again instead of draining the queue; once there is room, it runs them all."""
    from tests.test_disk_full import _fill
    from tests.test_implement import query

    db, url, repo = controller
    root = tmp_path / "small"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)], check=True)
    log = tmp_path / "runner.log"
    try:
        filler = _fill(root)
        jobs = [queue_job(db, state_dir, repo, 1, ("./ci/run", str(n))) for n in (1, 2, 3)]
        argv = runner_argv(
            "serve", "--server", url, "--worker-id", "r1", "--attempt-root", str(root)
        )
        with open(log, "w") as err:
            runner = subprocess.Popen(argv, stdout=err, stderr=err, env=runner_env())
        try:
            released = "select count(*) from events where kind = 'worker_job.released'"
            deadline = time.monotonic() + 60
            while query(state_dir / "aiworker.db", released) == [(0,)]:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            time.sleep(2)  # it waits: nothing else is claimed meanwhile
            assert [get_job(db, (1, n)).state for n in jobs] == ["queued"] * 3
            assert query(state_dir / "aiworker.db", released) == [(1,)]
            filler.unlink()
            deadline = time.monotonic() + 120
            while any(get_job(db, (1, n)).state != "succeeded" for n in jobs):
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        finally:
            runner.send_signal(signal.SIGTERM)
            runner.wait(timeout=60)
    finally:
        subprocess.run(["umount", "--lazy", str(root)], check=False)
    said = log.read_text()
    assert f"worker job 1/{jobs[0]}: handed back, this host's disk is full" in said
    assert f"attempt root {root} is full" in said
    assert "claiming again in 5 s" in said


def test_a_controller_stops_within_its_unit_s_grace_while_a_runner_long_polls(
    upgraded, tmp_path, monkeypatch
):
    """A runner waits in a long-poll (25 s by default) when the controller's listener is
    stopped, as systemd stops its unit (SIGTERM, then SIGKILL after TimeoutStopSec=15):
    the waiting claim ends with nothing leased and the listener exits well within that,
    so that its stop is clean; the runner then waits for the controller to come back."""
    monkeypatch.setenv("AIWORKER_CONFIG", str(write_config(tmp_path)))
    unit = (Path(__file__).parents[1] / "contrib/systemd/aiworker-web.service").read_text()
    grace = int(re.search(r"^TimeoutStopSec=(\d+)$", unit, re.MULTILINE).group(1))
    log = tmp_path / "runner.log"
    with runner_listener() as (listener, url, _operator):
        argv = [sys.executable, "-m", "aiworker", "--verbose", "runner", "serve"]
        argv += ["--server", url, "--worker-id", "r1", "--attempt-root", str(tmp_path / "a")]
        with open(log, "w") as err:
            runner = subprocess.Popen(
                [*argv, "--long-poll-ms", "25000"],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=runner_env(),
            )
        try:
            deadline = time.monotonic() + 60
            while "serving, contract" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            time.sleep(1)  # its first claim is waiting now
            listener.terminate()
            listener.wait(timeout=grace - 2)  # not killed: it stopped by itself
        finally:
            runner.terminate()
            runner.wait(timeout=60)
    assert listener.returncode in (0, -signal.SIGTERM)  # systemd takes either as clean


def test_a_server_that_refuses_the_token_but_is_no_runner_api_is_named_as_such(forge):
    """--server names the forge by mistake, which answers 401 for a path it does not
    know: that is said to be no runner API (exit 2, an operator's mistake), not a token
    the controller refused (exit 77, which would send them to rotate a good token)."""
    argv = runner_argv("run-job", "--server", forge.url, "--repository-index", "1")
    done = run([*argv, "--worker-job-index", "1"], token="x" * 32)
    assert done.returncode == 2, done.stdout + done.stderr
    message = json.loads(done.stdout)["error"]["message"]
    assert "that is not from aiworker's runner API" in message, message
    assert "token is not accepted" not in message
