"""A runner's logs go to the controller's artifact store as a resumable transfer: the
controller killed in the middle keeps what it received, the runner goes on from there
once it is back, and the result is accepted only when the payload is whole and
verified. Out-of-place, foreign and damaged chunks are refused; secrets never reach a
log, not even cut in half at its end."""

from __future__ import annotations

import hashlib
import json
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from aiworker.adapters.runner_api import CHUNK_BYTES
from aiworker.config.models import Runners
from aiworker.core.evidence.gate import run_gate
from aiworker.core.evidence.requirements import Requirement
from aiworker.core.runner.dispatch import Dispatch
from aiworker.runtime.execution import Limits, run_job
from aiworker.runtime.gitcache import GitCache
from aiworker.sandbox.gitrepo import BareRepo
from aiworker.sandbox.seed import PROJECT, create_project
from aiworker.store.engine import Database
from aiworker.store.worker_job_records import get_job
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
from tests.test_storage_reserve import small_disk  # noqa: F401 - a fixture

# About 1.9 MB on stdout: four chunks.
LOUD = "#!/bin/sh\nseq 1 300000\necho done >&2\n"
EXPECTED = "".join(f"{n}\n" for n in range(1, 300_001)).encode()
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(check, timeout, what):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def records(database: Path) -> list[tuple]:
    with sqlite3.connect(database) as connection:
        return connection.execute(
            "select name, sha256, size, worker_job from artifacts order by name"
        ).fetchall()


def test_a_transfer_cut_by_a_killed_controller_goes_on_from_what_it_kept(
    upgraded, tmp_path, monkeypatch, state_dir
):
    monkeypatch.setenv("AIWORKER_CONFIG", str(write_config(tmp_path, lease_seconds=60)))
    repo = tmp_path / "repo"
    commit_tree(repo, {"ci/run": LOUD})
    db = Database(f"sqlite:///{upgraded}")
    index = queue_job(db, state_dir, repo, 1)
    listen = f"127.0.0.1:{free_port()}"
    killed = {"AIWORKER_FAILPOINT": "runner_api.after_chunk"}
    argv = [sys.executable, "-m", "aiworker", "-v", "--json", "runner", "serve"]  # -v: its log
    argv += ["--server", f"http://{listen}", "--worker-id", "r1", "--once"]
    attempts = str(tmp_path / "attempts")
    runner = None
    try:
        with runner_listener(listen, env=killed) as (process, _url, _operator):
            runner = subprocess.Popen(
                [*argv, "--attempt-root", attempts],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=runner_env(),
            )
            # The first chunk is received (and fsynced), then the controller dies.
            process.wait(timeout=120)
            assert process.returncode == -9
        part = state_dir / "artifacts" / "partial" / f"{hashlib.sha256(EXPECTED).hexdigest()}.part"
        assert part.stat().st_size == CHUNK_BYTES
        assert get_job(db, (1, index)).state == "leased"  # nothing accepted half-sent
        assert records(upgraded) == []
        with runner_listener(listen):
            out, err = runner.communicate(timeout=180)
    finally:
        if runner is not None:
            runner.kill()
    assert runner.returncode == 0, err
    assert json.loads(out)["jobs"][0]["delivered"] == "complete"
    # It went on from the chunk the killed controller kept, not from the start.
    assert f"stdout.log goes on from byte {CHUNK_BYTES} of {len(EXPECTED)}" in err
    job = get_job(db, (1, index))
    assert (job.state, job.attempt) == ("succeeded", 1)
    result = job.result["result"]
    stdout = result["evidence"]["stdout"]
    [log] = [a for a in result["artifacts"] if a["name"] == "stdout.log"]
    # The whole stream, received in two runs of the controller, verified as one.
    assert log["sha256"] == stdout["sha256"] == hashlib.sha256(EXPECTED).hexdigest()
    assert log["size"] == len(EXPECTED)
    payload = state_dir / "artifacts" / "sha256" / log["sha256"][:2] / log["sha256"]
    assert payload.read_bytes() == EXPECTED
    assert not part.exists()
    # stderr ("done"): its tail in the result holds it whole, so no log was sent.
    assert [a["name"] for a in result["artifacts"]] == ["stdout.log"]
    kept = records(upgraded)
    assert [(name, size, job) for name, _sha, size, job in kept] == [
        ("stdout.log", len(EXPECTED), f"1/{index}"),
    ]
    db.dispose()


@pytest.fixture
def leased(upgraded, tmp_path, monkeypatch, state_dir):
    """A job run to the end by a runner (its result, to send again), a second one
    claimed by hand, and the listener: (db, url, first result, second pair, lease)."""
    monkeypatch.setenv("AIWORKER_CONFIG", str(write_config(tmp_path, lease_seconds=60)))
    repo = tmp_path / "repo"
    commit_tree(repo, {"ci/run": "#!/bin/sh\necho checked\n"})
    db = Database(f"sqlite:///{upgraded}")
    first = queue_job(db, state_dir, repo, 1)
    with runner_listener() as (_process, url, _operator):
        done = subprocess.run(
            [
                *runner_argv("serve", "--server", url, "--worker-id", "r1", "--once"),
                "--attempt-root",
                str(tmp_path / "a"),
            ],
            capture_output=True,
            text=True,
            env=runner_env(),
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        second = queue_job(db, state_dir, repo, 1)
        claimed = requests.post(
            f"{url}/api/runner/v1/claim",
            json={"worker_id": "hand", "request_key": "k1"},
            headers=AUTH,
            timeout=10,
        ).json()
        assert claimed["worker_job_index"] == second
        yield db, url, get_job(db, (1, first)).result["result"], (1, second), claimed["lease_token"]
    db.dispose()


def put(url, pair, digest, lease, offset, size, data):
    return requests.put(
        f"{url}/api/runner/v1/jobs/{pair[0]}/{pair[1]}/artifacts/{digest}",
        params={"offset": offset, "size": size},
        data=data,
        headers={**AUTH, "X-Aiworker-Lease": lease},
        timeout=10,
    )


def test_chunks_out_of_place_under_another_lease_or_damaged_are_refused(leased, state_dir):
    db, url, _result, pair, lease = leased
    data = b"0123456789" * 1000
    digest = hashlib.sha256(data).hexdigest()
    gap = put(url, pair, digest, lease, 10, len(data), data[10:])
    assert (gap.status_code, gap.json()["error"]["code"]) == (400, "offset_mismatch")
    foreign = put(url, pair, digest, "not-the-lease", 0, len(data), data)
    assert (foreign.status_code, foreign.json()["error"]["code"]) == (409, "lease_lost")
    assert put(url, pair, digest, lease, 0, len(data), data[:4000]).json() == {
        "received": 4000,
        "complete": False,
    }
    again = put(url, pair, digest, lease, 0, len(data), data[:4000])  # a repeated chunk
    assert (again.status_code, again.json()["error"]["code"]) == (400, "offset_mismatch")
    state = requests.get(
        f"{url}/api/runner/v1/jobs/{pair[0]}/{pair[1]}/artifacts/{digest}",
        headers={**AUTH, "X-Aiworker-Lease": lease},
        timeout=10,
    )
    assert state.json() == {"received": 4000, "complete": False}
    assert put(url, pair, digest, lease, 4000, len(data), data[4000:]).json() == {
        "received": len(data),
        "complete": True,
    }
    # Bytes that do not hash to the declared digest are dropped, never published.
    wrong = hashlib.sha256(b"something else").hexdigest()
    damaged = put(url, pair, wrong, lease, 0, len(data), data)
    assert (damaged.status_code, damaged.json()["error"]["code"]) == (400, "artifact_damaged")
    assert not (state_dir / "artifacts" / "sha256" / wrong[:2] / wrong).exists()
    assert not (state_dir / "artifacts" / "partial" / f"{wrong}.part").exists()
    over = put(url, pair, digest, lease, 0, 65 * 1024 * 1024, b"x")
    assert (over.status_code, over.json()["error"]["code"]) == (400, "artifact_too_large")
    # A finished job takes nothing more, not even under the lease that finished it.
    finished = (1, pair[1] - 1)
    late = put(url, finished, wrong, get_job(db, finished).lease_token, 0, 5, b"12345")
    assert (late.status_code, late.json()["error"]["code"]) == (409, "lease_lost")
    # Bytes held beyond what a sender says the payload holds cannot be its own: dropped.
    other = hashlib.sha256(b"abc").hexdigest()
    assert put(url, pair, other, lease, 0, 10, b"01234").json()["received"] == 5
    shorter = put(url, pair, other, lease, 0, 3, b"abc")
    assert (shorter.status_code, shorter.json()["error"]["code"]) == (400, "offset_mismatch")
    assert put(url, pair, other, lease, 0, 3, b"abc").json() == {"received": 3, "complete": True}


def test_a_result_naming_an_artifact_not_received_whole_is_refused(leased, upgraded):
    db, url, result, pair, lease = leased
    missing = {
        "name": "stdout.log",
        "sha256": hashlib.sha256(b"never sent").hexdigest(),
        "size": 10,
        "media_type": "text/plain",
    }
    answer = requests.post(
        f"{url}/api/runner/v1/jobs/{pair[0]}/{pair[1]}/complete",
        json={"lease_token": lease, "result": {**result, "artifacts": [missing]}},
        headers=AUTH,
        timeout=10,
    )
    assert (answer.status_code, answer.json()["error"]["code"]) == (400, "artifact_incomplete")
    assert get_job(db, pair).state == "leased"
    assert all(job != f"{pair[0]}/{pair[1]}" for *_rest, job in records(upgraded))


def test_a_log_keeps_the_stream_s_first_bytes_with_secrets_masked_even_cut_in_half(tmp_path):
    canary = b"CANARY-5f1e9d2c7b3a"
    script = (
        "import sys; w = sys.stdout.buffer.write; "
        f"w(b'a' * 100 + {canary!r} + b'b' * 100); w({canary!r}); w(b'c' * 1000)"
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    # The log's bound falls inside the second copy of the secret.
    bound = 100 + len(canary) + 100 + 8
    outcome = run_job(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "T": "1"},
        limits=Limits(timeout_s=30, log_dir=logs, log_bytes=bound),
        tag="T=1",
        secrets=[canary],
    )
    assert outcome.exit_code == 0
    assert outcome.stdout.log == logs / "stdout.log"
    kept = outcome.stdout.log.read_bytes()
    assert kept == b"a" * 100 + b"***" + b"b" * 100 + b"***"
    assert canary[:8] not in kept
    assert (logs / "stdout.log").stat().st_mode & 0o777 == 0o600
    assert outcome.stderr.log is None  # nothing printed: no log
    assert not (logs / "stderr.log").exists()


def test_the_embedded_runner_keeps_a_long_stream_s_log_with_the_check_s_receipt(
    upgraded, state_dir, tmp_path
):
    origin = tmp_path / "origin.git"
    create_project(BareRepo(origin), PROJECT)
    cache = GitCache(state_dir)
    cache.fetch(1, str(origin), None)
    cache.pin(1, 1, "base", "refs/remotes/origin/main")
    work = tmp_path / "ws"
    git("init", "-q", str(work))
    bundle = cache.bundle_out(1, 1, tmp_path / "base.bundle")
    git("fetch", "-q", str(bundle), "refs/aiworker/slot-1/base:refs/heads/base", cwd=work)
    git("checkout", "-q", "-b", "work", "base", cwd=work)
    (work / "ci" / "run.sh").write_text(LOUD)
    git("commit", "-qam", "a loud check", cwd=work)
    git("bundle", "create", "-q", str(tmp_path / "r.bundle"), "base..work", cwd=work)
    cache.import_result(1, 1, tmp_path / "r.bundle", "refs/heads/work")
    db = Database(f"sqlite:///{upgraded}")
    jobs = Dispatch(db, cache, state_dir, Runners(), {})
    report = run_gate(
        db,
        jobs,
        index=1,
        slot=1,
        task_id=None,
        scope="f" * 64,
        requirements=[Requirement("ci", ("./ci/run",))],
    )
    [check] = report.checks
    assert check["passed"], check
    digest = hashlib.sha256(EXPECTED).hexdigest()
    assert check["artifacts"]["stdout.log"] == check["stdout_sha256"] == digest
    assert "stderr.log" not in check["artifacts"]  # "done": the tail holds it whole
    payload = state_dir / "artifacts" / "sha256" / digest[:2] / digest
    assert payload.read_bytes() == EXPECTED
    kept = [(name, job) for name, sha, _size, job in records(upgraded) if sha == digest]
    job = f"{check['worker_job']['repository_index']}/{check['worker_job']['worker_job_index']}"
    # Once with the job that sent it, once with the receipt that names it.
    assert kept == [("stdout.log", job), ("stdout.log", job)]
    with sqlite3.connect(upgraded) as connection:
        receipts = connection.execute(
            "select receipt_id from artifacts where sha256 = ? and receipt_id is not null",
            (digest,),
        ).fetchall()
    assert receipts == [(check["receipt"],)]
    db.dispose()


def test_a_log_the_disk_cannot_hold_is_dropped_and_the_job_still_runs_to_its_end(
    small_disk,  # noqa: F811 - the fixture
    tmp_path,
):
    logs = small_disk / "logs"
    logs.mkdir()
    with open(small_disk / "ballast", "wb") as ballast:  # leave about 1 MiB free
        ballast.write(b"\0" * (47 * 1024 * 1024))
    outcome = run_job(
        [sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'x' * 4_000_000)"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "T": "1"},
        limits=Limits(timeout_s=30, log_dir=logs, log_bytes=8 * 1024 * 1024),
        tag="T=1",
    )
    assert outcome.exit_code == 0
    assert outcome.stdout.total_bytes == 4_000_000
    assert outcome.stdout.sha256 == hashlib.sha256(b"x" * 4_000_000).hexdigest()
    assert outcome.stdout.log is None
    assert list(logs.iterdir()) == []
