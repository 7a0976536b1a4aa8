"""`runner execute` with real scripts: status, evidence, timeouts, drain and cleanup."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import time

import pytest

from tests.runner_helpers import execute, make_source, pid_alive, request


@pytest.fixture
def attempts(tmp_path):
    root = tmp_path / "attempts"
    root.mkdir()
    return root


def tail_of(result, stream="stdout") -> bytes:
    return base64.b64decode(result.json()["evidence"][stream]["tail_base64"])


def test_success(tmp_path, attempts):
    source = make_source(tmp_path, 'echo "hello $AIWORKER_SUITE_ID $*"\n')
    result = execute(
        request(source, command={"argv": ["./ci/run", "a b", "--flag"]}),
        source_root=tmp_path,
        attempt_root=attempts,
    )
    assert result.exit_code == 0, result
    doc = result.json()
    assert doc["contract"] == "ait.runner.native-result.v1"
    assert (doc["status"], doc["tests_status"], doc["exit_code"]) == ("succeeded", "pass", 0)
    assert tail_of(result) == b"hello suite-1 a b --flag\n"
    assert doc["suites"] == [
        {"suite_id": "suite-1", "status": "pass", "duration_ms": doc["duration_ms"]}
    ]
    assert doc["materialization"]["files"] == 1
    assert doc["cleanup"]["removed"] is True
    assert list(attempts.iterdir()) == []


def test_exit_code_three_is_command_failed(tmp_path, attempts):
    source = make_source(tmp_path, "echo failing >&2\nexit 3\n")
    result = execute(request(source), source_root=tmp_path, attempt_root=attempts)
    assert result.exit_code == 1, result
    doc = result.json()
    assert (doc["status"], doc["tests_status"], doc["exit_code"]) == ("command_failed", "fail", 3)
    assert doc["signal"] is None
    assert tail_of(result, "stderr") == b"failing\n"
    assert list(attempts.iterdir()) == []


def test_killed_by_its_own_signal_is_command_failed(tmp_path, attempts):
    source = make_source(tmp_path, "kill -KILL $$\n")
    doc = execute(request(source), source_root=tmp_path, attempt_root=attempts).json()
    assert (doc["status"], doc["exit_code"], doc["signal"]) == ("command_failed", None, "SIGKILL")
    assert doc["termination"]["signals_sent"] == []


def sha256sum(path) -> str:
    out = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def test_one_mebibyte_on_each_stream(tmp_path, attempts):
    source = make_source(tmp_path, "cat out.bin\ncat err.bin >&2\n")
    (source / "out.bin").write_bytes(os.urandom(1024 * 1024))
    (source / "err.bin").write_bytes(os.urandom(1024 * 1024 - 7) + b"\xff\xfe\x00invalid")
    result = execute(request(source), source_root=tmp_path, attempt_root=attempts)
    assert result.exit_code == 0, result
    evidence = result.json()["evidence"]
    for stream, name in (("stdout", "out.bin"), ("stderr", "err.bin")):
        data = (source / name).read_bytes()
        assert evidence[stream]["total_bytes"] == len(data)
        assert evidence[stream]["sha256"] == sha256sum(source / name)
        assert tail_of(result, stream) == data[-64 * 1024 :]
        assert evidence[stream]["tail_bytes"] == 64 * 1024
        assert evidence[stream]["truncated"] is True
        assert evidence[stream]["masked"] is False


def test_small_output_is_not_truncated_and_tail_size_is_configurable(tmp_path, attempts):
    source = make_source(tmp_path, "printf 0123456789\n")
    result = execute(
        request(source), source_root=tmp_path, attempt_root=attempts, extra=("--tail-bytes", "4")
    )
    out = result.json()["evidence"]["stdout"]
    assert (out["total_bytes"], out["truncated"]) == (10, True)
    assert tail_of(result) == b"6789"
    whole = execute(request(source), source_root=tmp_path, attempt_root=attempts).json()
    assert whole["evidence"]["stdout"]["truncated"] is False
    assert whole["evidence"]["stdout"]["sha256"] == hashlib.sha256(b"0123456789").hexdigest()


ESCAPING_JOB = """
sleep 300 &
echo "child $!"
setsid sleep 301 &
echo "daemon $!"
setsid sh -c 'trap "" TERM; sleep 302 & echo "stubborn $!"; wait' &
sh -c 'sleep 303 & echo "double $!"' &
trap "" TERM
sleep 1000
"""


def test_timeout_kills_every_process_of_the_attempt(tmp_path, attempts):
    source = make_source(tmp_path, ESCAPING_JOB)
    started = time.monotonic()
    result = execute(
        request(source, timeout_ms=1500),
        source_root=tmp_path,
        attempt_root=attempts,
        extra=("--kill-grace-ms", "500"),
    )
    elapsed = time.monotonic() - started
    assert result.exit_code == 1, result
    doc = result.json()
    assert (doc["status"], doc["tests_status"]) == ("timed_out", "fail")
    assert doc["termination"]["signals_sent"] == ["SIGTERM", "SIGKILL"]
    pids = {name: int(pid) for name, pid in re.findall(rb"(\w+) (\d+)", tail_of(result))}
    assert set(pids) == {b"child", b"daemon", b"stubborn", b"double"}, tail_of(result)
    alive = [pid for pid in pids.values() if pid_alive(pid)]
    assert alive == []
    assert elapsed < 20
    assert list(attempts.iterdir()) == []


def test_leftover_holding_the_pipes_is_drained_then_killed(tmp_path, attempts):
    source = make_source(tmp_path, 'sleep 600 &\necho "left $!"\nexit 0\n')
    started = time.monotonic()
    result = execute(
        request(source),
        source_root=tmp_path,
        attempt_root=attempts,
        extra=("--drain-timeout-ms", "500"),
    )
    elapsed = time.monotonic() - started
    doc = result.json()
    assert doc["status"] == "succeeded"
    assert doc["termination"]["drain_timed_out"] is True
    assert doc["termination"]["leftover_processes_killed"] == 1
    pid = int(re.search(rb"left (\d+)", tail_of(result)).group(1))
    assert not pid_alive(pid)
    assert elapsed < 15


def test_daemon_that_closed_its_output_is_killed_too(tmp_path, attempts):
    source = make_source(tmp_path, 'setsid sleep 600 >/dev/null 2>&1 &\necho "d $!"\n')
    result = execute(request(source), source_root=tmp_path, attempt_root=attempts)
    doc = result.json()
    assert doc["termination"]["drain_timed_out"] is False
    assert doc["termination"]["leftover_processes_killed"] == 1
    assert not pid_alive(int(re.search(rb"d (\d+)", tail_of(result)).group(1)))


def test_read_only_tree_and_outside_links_are_removed_safely(tmp_path, attempts):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    source = make_source(
        tmp_path,
        "mkdir -p deep/er && echo x > deep/er/f && chmod -R a-w deep && chmod a-w . \necho done\n",
    )
    (source / "link-file").symlink_to(outside / "keep.txt")
    (source / "link-dir").symlink_to(outside)
    result = execute(request(source), source_root=tmp_path, attempt_root=attempts)
    assert result.exit_code == 0, result
    doc = result.json()
    assert doc["materialization"]["symlinks"] == 2
    assert doc["cleanup"]["removed"] is True
    assert doc["cleanup"]["error"] is None
    assert list(attempts.iterdir()) == []
    assert (outside / "keep.txt").read_text() == "precious"
    assert (source / "link-file").is_symlink()


def test_source_is_copied_not_run_in_place(tmp_path, attempts):
    source = make_source(tmp_path, "echo new > created.txt\nrm ci/run.sh\n")
    result = execute(request(source), source_root=tmp_path, attempt_root=attempts)
    assert result.exit_code == 0, result
    assert not (source / "created.txt").exists()
    assert (source / "ci" / "run.sh").exists()


def test_working_directory_and_its_entrypoint(tmp_path, attempts):
    source = make_source(tmp_path, "echo root\n")
    make_source(source, "pwd\n", name="sub")
    result = execute(
        request(source, command={"working_directory": "sub"}),
        source_root=tmp_path,
        attempt_root=attempts,
    )
    assert result.exit_code == 0, result
    assert tail_of(result).decode().rstrip().endswith("/workspace/sub")


def test_environment_is_controlled(tmp_path, attempts):
    source = make_source(tmp_path, "env\n")
    result = execute(
        request(source, command={"environment": {"GREETING": "hi", "PATH": "/usr/bin:/bin"}}),
        source_root=tmp_path,
        attempt_root=attempts,
        env={"AIWORKER_SERVER_TOKEN": "canary-runner-token-1234", "SOME_HOST_VAR": "host"},
    )
    env = dict(line.split("=", 1) for line in tail_of(result).decode().splitlines() if "=" in line)
    assert env["GREETING"] == "hi"
    assert env["PATH"] == "/usr/bin:/bin"
    assert env["AIWORKER_SUITE_ID"] == "suite-1"
    assert env["AIWORKER_ATTEMPT_ID"] == result.json()["attempt_id"]
    assert env["AIWORKER_WORKSPACE"].endswith("/workspace")
    assert "SOME_HOST_VAR" not in env
    assert "canary-runner-token-1234" not in result.stdout + result.stderr


def test_secret_values_are_masked_in_tails_but_hashed_raw(tmp_path, attempts):
    secret = "s3cr3t-value-98765"
    source = make_source(tmp_path, 'echo "token=$API_TOKEN end"\necho "$API_TOKEN" >&2\n')
    result = execute(
        request(
            source,
            command={"environment": {"API_TOKEN": secret}, "secret_environment": ["API_TOKEN"]},
        ),
        source_root=tmp_path,
        attempt_root=attempts,
    )
    evidence = result.json()["evidence"]
    assert tail_of(result) == b"token=*** end\n"
    assert evidence["stdout"]["masked"] is True
    raw = f"token={secret} end\n".encode()
    assert evidence["stdout"]["sha256"] == hashlib.sha256(raw).hexdigest()
    assert evidence["stdout"]["total_bytes"] == len(raw)
    assert secret not in result.stdout
