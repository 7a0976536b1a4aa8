"""The runner API on its own listener (`web serve --runner-listen`), over real HTTP: bearer
tokens from the configuration, idempotent claims, lease proof on heartbeat and finish,
"already finished" final, long-poll pickup, and no operator route on that listener (nor a
runner route on the operator's)."""

from __future__ import annotations

import base64
import os
import socket
import threading
import time
from pathlib import Path

import pytest
import requests

from aiworker.contracts.runner import JobResult
from aiworker.core.runner.runner_tokens import AcceptedTokens
from aiworker.store.engine import Database
from aiworker.store.worker_job_records import get_job
from aiworker.store.worker_jobs import enqueue
from tests.fleet_fixtures import TOKEN, runner_listener, write_config

SHORT = "runner-short"


@pytest.fixture
def fleet(upgraded, tmp_path, monkeypatch):
    monkeypatch.setenv("AIWORKER_CONFIG", str(write_config(tmp_path)))
    db = Database(f"sqlite:///{upgraded}")
    with runner_listener() as listener:
        yield listener.operator, listener.url, db
    db.dispose()


def job_result(label, suite):
    """A runner result document (ait.runner.native-result.v1) for LABEL and SUITE."""
    stream = {
        "total_bytes": 0,
        "sha256": "0" * 64,
        "tail_base64": "",
        "tail_bytes": 0,
        "truncated": False,
        "masked": False,
    }
    return JobResult.model_validate(
        {
            "label": label,
            "suite_id": suite,
            "attempt_id": "a1",
            "status": "succeeded",
            "tests_status": "pass",
            "exit_code": 0,
            "signal": None,
            "started_at": "2026-12-01T00:00:00+00:00",
            "finished_at": "2026-12-01T00:00:01+00:00",
            "duration_ms": 1000,
            "suites": [{"suite_id": suite, "status": "pass", "duration_ms": 1000}],
            "materialization": dict.fromkeys(
                ("files", "directories", "symlinks", "skipped_special", "bytes", "duration_ms"), 0
            ),
            "evidence": {"stdout": stream, "stderr": stream},
            "termination": {
                "signals_sent": [],
                "drain_timed_out": False,
                "leftover_processes_killed": 0,
            },
            "cleanup": {
                "removed": True,
                "attempt_path": "/tmp/a1",
                "entries_removed": 1,
                "duration_ms": 1,
            },
        }
    ).model_dump(mode="json")


def call(runner, path, body=None, token=TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is None:
        return requests.get(f"{runner}/api/runner/v1{path}", headers=headers, timeout=40)
    return requests.post(f"{runner}/api/runner/v1{path}", json=body, headers=headers, timeout=40)


def test_a_runner_claims_beats_and_finishes_with_its_lease(fleet):
    _, runner, db = fleet
    assert call(runner, "/health").json() == {
        "ok": True,
        "contracts": ["ait.runner.native-job.v3"],
        "lease_seconds": 30,
    }
    assert call(runner, "/health", token=None).status_code == 401
    assert call(runner, "/health", token="guess").json()["error"]["code"] == "unauthorized"
    # A token shorter than 32 characters is never accepted; a malformed source is skipped.
    assert call(runner, "/health", token=SHORT).status_code == 401
    enqueue(db, 1, {"label": "ci"})
    enqueue(db, 2, {"label": "other", "suite_id": "s"})
    claim = {"worker_id": "r1", "request_key": "c-1", "repository_indexes": [2]}
    first = call(runner, "/claim", claim)
    assert first.status_code == 200, first.text
    lease = first.json()
    assert (lease["repository_index"], lease["request"], lease["attempt"]) == (
        2,
        {"label": "other", "suite_id": "s"},
        1,
    )
    # The reply was lost: the same key gets the same lease, not a second job, with what
    # is left of it by the controller's clock.
    again = call(runner, "/claim", claim).json()
    assert again.pop("lease_remaining_ms") <= lease.pop("lease_remaining_ms") <= 30_000
    assert again == lease
    assert call(runner, "/claim", {**claim, "request_key": "c-2"}).status_code == 204
    # An empty filter is no repository at all, not every one.
    assert (
        call(
            runner, "/claim", {**claim, "request_key": "c-3", "repository_indexes": []}
        ).status_code
        == 204
    )
    job = f"/jobs/{lease['repository_index']}/{lease['worker_job_index']}"
    assert (
        call(runner, f"{job}/heartbeat", {"lease_token": lease["lease_token"]}).status_code == 200
    )
    result = job_result("other", "s")
    forged = call(runner, f"{job}/complete", {"lease_token": "x" * 32, "result": result})
    assert (forged.status_code, forged.json()["error"]["code"]) == (409, "lease_lost")
    proof = lease["lease_token"]
    # Only a valid result of this job's own request is accepted.
    # Evidence beyond the runner's 64 KiB tail, or whose count or digest says otherwise.
    big = base64.b64encode(b"x" * 600_000).decode()
    oversized = {"total_bytes": 600_000, "sha256": "0" * 64, "tail_base64": big}
    miscounted = {"total_bytes": 10, "sha256": "0" * 64, "tail_base64": "eHh4", "tail_bytes": 9}
    unhashed = {"sha256": "not a digest"}
    stretched = [
        {**result, "evidence": {**result["evidence"], "stdout": {**stream, **change}}}
        for stream in [result["evidence"]["stdout"]]
        for change in (
            {**oversized, "tail_bytes": 600_000},
            miscounted,
            unhashed,
        )
    ]
    for wrong in ({"exit_code": 0}, job_result("another", "s"), *stretched):
        refused = call(runner, f"{job}/complete", {"lease_token": proof, "result": wrong})
        assert refused.status_code == 400, refused.text
    done = call(runner, f"{job}/complete", {"lease_token": proof, "result": result})
    assert done.json()["status"] == "finished", done.text
    delivery = done.json()["delivery"]
    assert delivery["contract"] == "ait.runner.delivery.v1"
    assert (delivery["outcome"], delivery["attempt"], delivery["worker_id"]) == (
        "completed",
        1,
        "r1",
    )
    assert delivery["result"] == result
    error = {"code": "late", "message": "a second outcome"}
    again = call(runner, f"{job}/fail", {"lease_token": proof, "error": error})
    assert again.json() == {"status": "already finished", "delivery": delivery}
    assert (
        call(runner, f"{job}/heartbeat", {"lease_token": lease["lease_token"]}).status_code == 409
    )
    bad = call(runner, "/claim", {"worker_id": "r 1", "request_key": "k"})
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_input")
    # An index beyond what the database holds is refused, not a server error (found by
    # the runner API's fuzz run).
    huge = {"worker_id": "r1", "request_key": "k", "repository_indexes": [2**70]}
    assert call(runner, "/claim", huge).status_code == 400


def test_a_token_file_caught_mid_rewrite_keeps_its_token_and_a_removed_one_revokes_it(
    fleet, tmp_path
):
    _, runner, _ = fleet
    token_file = tmp_path / "runner.token"
    assert call(runner, "/health").status_code == 200
    token_file.write_text("half-writ")  # truncated, not yet the whole new token
    time.sleep(1.2)  # past the service's re-read interval
    assert call(runner, "/health").status_code == 200
    # A file that stays without a whole token (emptied to revoke it, or overwritten with
    # a token too short to accept) is no rewrite: its old token is refused, however
    # long ago that was when the server next looks.
    written = time.time() - AcceptedTokens.REWRITE_S
    os.utime(token_file, (written, written))
    time.sleep(1.2)
    assert call(runner, "/health").status_code == 401
    token_file.write_text(TOKEN + "\n")
    time.sleep(1.2)
    assert call(runner, "/health").status_code == 200
    token_file.unlink()
    time.sleep(1.2)
    assert call(runner, "/health").status_code == 401


def test_a_waiting_runner_picks_a_job_up_as_soon_as_it_is_queued(fleet):
    _, runner, db = fleet
    threading.Timer(0.5, enqueue, (db, 1, {"label": "late"})).start()
    started = time.monotonic()
    picked = call(runner, "/claim", {"worker_id": "r1", "request_key": "w-1", "wait_ms": 10_000})
    waited = time.monotonic() - started
    assert picked.status_code == 200, picked.text
    assert picked.json()["request"] == {"label": "late"}
    assert 0.4 < waited < 5.0
    empty = call(runner, "/claim", {"worker_id": "r1", "request_key": "w-2", "wait_ms": 300})
    assert empty.status_code == 204


def test_each_listener_serves_only_its_own_routes(fleet):
    operator, runner, _ = fleet
    elsewhere = requests.get(f"{runner}/api/v1/status", timeout=10)
    assert elsewhere.status_code == 404
    # What the framework refuses answers in the CLI's error shape, as everything else.
    assert elsewhere.json() == {"error": {"code": "http", "message": "Not Found"}}
    wrong = requests.delete(f"{runner}/api/runner/v1/claim", timeout=10)
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (405, "http")
    assert wrong.headers["allow"] == "POST"
    assert requests.get(f"{operator}/api/runner/v1/health", timeout=10).status_code in (404, 421)
    assert requests.get(f"{operator}/api/v1/status", timeout=10).status_code == 200
    shown = requests.get(f"{operator}/api/v1/settings", timeout=10).text
    assert TOKEN not in shown
    assert "runner-1" in shown


def test_waiting_runners_do_not_starve_the_other_requests(fleet):
    operator, runner, _ = fleet
    waiting = [
        threading.Thread(
            target=call,
            args=(runner, "/claim", {"worker_id": f"r{n}", "request_key": "k", "wait_ms": 15_000}),
        )
        for n in range(45)
    ]
    for thread in waiting:
        thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    assert requests.get(f"{operator}/api/v1/status", timeout=10).status_code == 200
    assert call(runner, "/health").status_code == 200
    # Answered while the 45 claims still wait (15 s): starved, they would wait that out.
    # (Not a speed target: busy cores take seconds here.)
    assert time.monotonic() - started < 10.0
    for thread in waiting:
        thread.join()


def test_the_runner_listener_beyond_loopback_needs_the_explicit_flag():
    from tests.helpers import run_process

    refused = run_process("--json", "web", "serve", "--runner-listen", "0.0.0.0:0")
    assert refused.exit_code == 2
    assert "--allow-remote" in refused.json()["error"]["message"]


OTHER = "runner-token-of-another-runner-0123456789abcdef"


def test_a_lease_answers_only_the_token_that_claimed_it(upgraded, tmp_path, monkeypatch):
    files = []
    for name, token in (("one", TOKEN), ("two", OTHER)):
        path = tmp_path / f"{name}.token"
        path.write_text(token + "\n")
        path.chmod(0o600)
        files.append(f'{{token_file = "{path}"}}')
    config = tmp_path / "config.toml"
    config.write_text(f"[runners]\nlease_seconds = 30\ntokens = [{', '.join(files)}]\n")
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))
    db = Database(f"sqlite:///{upgraded}")
    try:
        with runner_listener() as listener:
            runner = listener.url
            enqueue(db, 1, {"label": "ci"})
            claim = {"worker_id": "r1", "request_key": "k-1"}
            lease = call(runner, "/claim", claim).json()
            proof = {"lease_token": lease["lease_token"]}
            # Another runner's token with the same request key gets no lease, not this one.
            assert call(runner, "/claim", claim, token=OTHER).status_code == 204
            job = f"/jobs/{lease['repository_index']}/{lease['worker_job_index']}"
            result = {**proof, "result": job_result("ci", "s")}
            for path, body in (("heartbeat", proof), ("complete", result), ("release", proof)):
                refused = call(runner, f"{job}/{path}", body, token=OTHER)
                assert (refused.status_code, refused.json()["error"]["code"]) == (
                    409,
                    "lease_lost",
                ), path
            assert call(runner, f"{job}/heartbeat", proof).status_code == 200
            assert get_job(db, (1, 1)).state == "leased"
            assert call(runner, f"{job}/release", proof).json() == {"released": True}
    finally:
        db.dispose()


def test_a_connection_whose_request_never_comes_is_closed(upgraded, tmp_path, monkeypatch):
    """A client that opened connections and sent nothing, or a request head a byte at a
    time, held them for ever: about a thousand of them took every file descriptor under
    systemd's default limit of 1024, and both listeners stopped answering. A connection
    whose head is late is closed now, and the server takes its hard limit of files."""
    from aiworker.web.connections import HEAD_S

    monkeypatch.setenv("AIWORKER_CONFIG", str(write_config(tmp_path)))
    with runner_listener(prefix=("prlimit", "--nofile=1024:4096")) as listener:
        limits = Path(f"/proc/{listener.process.pid}/limits").read_text()
        [line] = [x for x in limits.splitlines() if x.startswith("Max open files")]
        assert line.split()[3:5] == ["4096", "4096"]
        host, port = listener.url.removeprefix("http://").split(":")
        silent = socket.create_connection((host, int(port)), timeout=HEAD_S + 30)
        partial = socket.create_connection((host, int(port)), timeout=HEAD_S + 30)
        partial.sendall(f"GET /api/runner/v1/health HTTP/1.1\r\nHost: {host}".encode())
        opened = time.monotonic()
        for conn in (silent, partial):
            with conn:
                assert conn.recv(1024) == b""  # the server closed it, with no answer
        assert time.monotonic() - opened < HEAD_S + 30
        health = requests.get(
            f"{listener.url}/api/runner/v1/health",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert health.json()["ok"] is True


def test_an_idle_connection_outlives_a_heartbeat_interval(fleet):
    """A runner keeps its connection for the next heartbeat; the server must not close it
    after a few idle seconds (a request sent as it closes is reset, and the job failed)."""
    _operator, runner, _db = fleet
    host, port = runner.removeprefix("http://").split(":")
    ask = (
        f"GET /api/runner/v1/health HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        answers = conn.makefile("rb")
        for idle in (0, 7):  # then past uvicorn's own 5 s
            time.sleep(idle)
            conn.sendall(ask)
            status = answers.readline()
            assert status.startswith(b"HTTP/1.1 200"), status
            headers = dict(
                line.decode().lower().rstrip("\r\n").split(": ", 1)
                for line in iter(answers.readline, b"\r\n")
            )
            assert b'"ok":true' in answers.read(int(headers["content-length"]))


def test_requests_waiting_on_a_stalled_forge_leave_the_page_and_the_runners_answered(
    upgraded, tmp_path, monkeypatch
):
    """Forty-odd access checks from the page while the forge takes connections and answers
    none: the page's status and the runners' API still answer, each before the forge's
    timeout. Before, every request waited on the forge's threads, runners' heartbeats
    included, until their leases ran out."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.test_web_api import session

    stalled = socket.create_server(("127.0.0.1", 0), backlog=128)  # takes, answers nothing
    port = stalled.getsockname()[1]
    monkeypatch.setenv("AIWORKER_TEST_TOKEN", "f" * 40)
    roles = "".join(
        f'[forge.identities.{role}]\ntoken_env = "AIWORKER_TEST_TOKEN"\n'
        for role in ("planner", "worker", "reviewer")
    )
    extra = f'[forge]\nurl = "http://127.0.0.1:{port}"\ntimeout_seconds = 300\n{roles}'
    extra += '[[repositories]]\nindex = 1\nowner = "team"\nname = "app"\n'
    monkeypatch.setenv("AIWORKER_CONFIG", str(write_config(tmp_path, extra=extra)))
    # The server ends before the pool: the checks it leaves waiting fail then.
    with ThreadPoolExecutor(48) as pool, runner_listener() as listener:
        client = session(listener.operator)
        check = f"{listener.operator}/api/v1/access/check"
        waiting = [pool.submit(client.post, check, timeout=600) for _ in range(48)]
        deadline = time.monotonic() + 60
        while _connections_to(port) < 1:  # the checks reached the forge
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(3)  # and the rest of them are taken up
        status = requests.get(f"{listener.operator}/api/v1/status", timeout=60)
        assert status.status_code == 200, status.text
        assert call(listener.url, "/health").json()["ok"] is True
        listener.process.kill()  # the checks wait on: the server has no time for them
        stalled.close()
        for check in waiting:
            with pytest.raises(requests.ConnectionError):
                check.result()


def _connections_to(port: int) -> int:
    """Connections made to PORT on loopback (accepted by the kernel or not)."""
    table = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for row in table if row.split()[2] == f"0100007F:{port:04X}")


def test_a_controller_on_an_older_schema_answers_unavailable_not_bad_request(fleet, upgraded):
    """Between installing a new version and `db upgrade`, the runner API and the page
    are answered 503, naming the upgrade: a runner waits and tries again (a 400 told it
    its own request was wrong, and it gave up), and monitoring sees a server problem."""
    import sqlite3

    operator, runner, _ = fleet
    with sqlite3.connect(upgraded) as connection:
        connection.execute("UPDATE alembic_version SET version_num = '0008_authorized_scope'")
    claim = call(runner, "/claim", {"worker_id": "r1", "request_key": "k-1"})
    status = requests.get(f"{operator}/api/v1/status", timeout=40)
    for answer in (claim, status):
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "schema_mismatch"
        assert "run `aiworker db upgrade`" in error["message"]
