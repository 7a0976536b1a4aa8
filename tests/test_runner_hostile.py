"""Hostile jobs and inputs that bypass validation: the runner answers every one with a
document, cleans up, and the next run on the same attempt root is unharmed."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.runner_helpers import execute, make_source, request, runner_argv

DEEP = 1200


def tail(stream: dict) -> str:
    return base64.b64decode(stream["tail_base64"]).decode()


@pytest.fixture
def roots(tmp_path):
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    return tmp_path, attempts


def test_a_tree_too_deep_for_recursion_is_removed_and_the_next_run_is_fine(roots):
    root, attempts = roots
    # 1,200 levels deep, read-only on the way down, plus a link out of the attempt.
    script = (
        'python3 -c "import os\n'
        "top = os.path.join(os.environ['AIWORKER_WORKSPACE'], 'deep')\n"
        "os.mkdir(top)\n"
        "os.chdir(top)\n"
        f"for _ in range({DEEP}): os.mkdir('d'); os.chdir('d')\n"
        'os.chmod(top, 0o500)"\n'
        f'ln -s {root} "$AIWORKER_WORKSPACE/escape"\n'
    )
    source = make_source(root, script)
    result = execute(request(source), source_root=root, attempt_root=attempts)
    assert result.exit_code == 0, result
    document = result.json()
    assert document["cleanup"]["removed"] is True, document["cleanup"]
    assert document["cleanup"]["entries_removed"] >= DEEP
    assert list(attempts.iterdir()) == []
    assert (root / "src" / "ci" / "run.sh").exists()  # the link was not followed
    again = execute(request(source), source_root=root, attempt_root=attempts)
    assert again.exit_code == 0, again


def test_things_planted_beside_attempts_are_skipped_not_followed(roots):
    root, attempts = roots
    victim = root / "victim"
    victim.mkdir()
    (victim / ".aiworker-attempt.json").write_text(json.dumps({"pid": 2**22 + 7}))
    (victim / "keep").write_text("keep")
    script = (
        f'ln -s {victim} "$AIWORKER_WORKSPACE/../../attempt-planted-link"\n'
        'echo x > "$AIWORKER_WORKSPACE/../../attempt-planted-file"\n'
    )
    source = make_source(root, script)
    assert execute(request(source), source_root=root, attempt_root=attempts).exit_code == 0
    quiet = make_source(root, "exit 0\n", name="quiet")
    for _ in range(2):
        result = execute(request(quiet), source_root=root, attempt_root=attempts)
        assert result.exit_code == 0, result
    assert (victim / "keep").read_text() == "keep"
    assert sorted(p.name for p in attempts.iterdir()) == [
        "attempt-planted-file",
        "attempt-planted-link",
    ]


def test_markers_planted_by_a_job_neither_hang_the_sweep_nor_kill_another_job(roots):
    """A job runs as the runner's user and can write beside its attempt: a FIFO as a
    marker, or a marker naming a dead pid and another running job's attempt."""
    root, attempts = roots
    victim = make_source(root, "sleep 8\necho victim finished\n", name="victim")
    running = subprocess.Popen(
        runner_argv(root, attempts),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        running.stdin.write(json.dumps(request(victim)).encode())
        running.stdin.close()
        deadline = time.monotonic() + 60
        while not list(attempts.glob("attempt-*")):
            assert time.monotonic() < deadline, "the victim's attempt never appeared"
            time.sleep(0.1)
        [theirs] = [p.name.removeprefix("attempt-") for p in attempts.glob("attempt-*")]
        script = (
            'root="$AIWORKER_WORKSPACE/../.."\n'
            'mkdir "$root/attempt-fifo" "$root/attempt-other"\n'
            'mkfifo "$root/attempt-fifo/.aiworker-attempt.json"\n'
            f'printf \'{{"attempt_id": "{theirs}", "pid": {2**22 + 7}}}\' '
            '> "$root/attempt-other/.aiworker-attempt.json"\n'
        )
        planter = make_source(root, script, name="planter")
        planted = execute(request(planter), source_root=root, attempt_root=attempts)
        assert planted.exit_code == 0, planted
        quiet = make_source(root, "exit 0\n", name="quiet")
        result = execute(request(quiet), source_root=root, attempt_root=attempts, timeout=60)
        assert result.exit_code == 0, result
        out = running.stdout.read()
        running.wait(timeout=60)
    finally:
        running.kill()
        running.wait()
        running.stdout.close()
    document = json.loads(out)
    assert (document["status"], document["exit_code"]) == ("succeeded", 0), document
    assert tail(document["evidence"]["stdout"]) == "victim finished\n"
    assert {"attempt-fifo", "attempt-other"} <= {p.name for p in attempts.iterdir()}


def _cases(source):
    base = request(source)
    nul_argv = request(source, command={"argv": ["./ci/run", "a\x00b"]})
    return [
        ("invalid_field", "command.argv[1]: must not contain a NUL byte", nul_argv),
        ("invalid_field", "source.path: must not contain a NUL byte", request(f"{source}\x00x")),
        # A lone surrogate (JSON "\ud800") cannot reach an argv, a path or an environment.
        ("invalid_field", "source.path: must be valid Unicode", request(f"{source}\ud800")),
        (
            "invalid_field",
            "command.environment.\udc80: must be valid Unicode",
            request(source, command={"environment": {"\udc80": "x"}}),
        ),
        (
            "invalid_field",
            "timeout_ms: must be an integer",
            {**base, "timeout_ms": True},
        ),
        (
            "invalid_field",
            "timeout_ms: must be an integer",
            {**base, "timeout_ms": "5000"},
        ),
        (
            "invalid_field",
            "timeout_ms: must be an integer",
            {**base, "timeout_ms": 5e3},
        ),
    ]


def test_inputs_that_bypassed_validation_are_refused_and_run_nothing(roots):
    root, attempts = roots
    marker = root / "ran.marker"
    source = make_source(root, f"touch {marker}\n")
    for code, message, document in _cases(source):
        result = execute(document, source_root=root, attempt_root=attempts)
        assert result.exit_code == 2, (message, result)
        assert result.stdout.count("\n") == 1
        error = result.json()
        assert (error["contract"], error["code"]) == ("ait.runner.error.v1", code)
        assert error["message"] == message
    assert not marker.exists()
    assert list(attempts.iterdir()) == []


def test_path_options_that_cannot_work_are_refused(roots):
    root, attempts = roots
    marker = root / "ran.marker"
    source = make_source(root, f"touch {marker}\n")
    missing = execute(
        b"", source_root=root, attempt_root=attempts, extra=("--request", "nope.json")
    )
    a_file = root / "a-file"
    a_file.write_text("x")
    as_file = execute(request(source), source_root=root, attempt_root=a_file)
    inside = execute(request(source), source_root=root, attempt_root=source / "attempts")
    # One that cannot be made (under /proc), and another user's folder: refused alike.
    unmakeable = execute(request(source), source_root=root, attempt_root=Path("/proc/1/x"))
    refused = [
        (missing, "request_unreadable"),
        (as_file, "attempt_root_invalid"),
        (inside, "attempt_root_inside_source"),
        (unmakeable, "attempt_root_invalid"),
    ]
    others = root / "others"
    if os.geteuid() == 0:  # only root makes a folder another user's
        others.mkdir()
        os.chown(others, 65534, 65534)
        foreign = execute(request(source), source_root=root, attempt_root=others)
        assert foreign.json()["message"] == f"attempt root {others}: belongs to another user"
        refused.append((foreign, "attempt_root_invalid"))
    for result, code in refused:
        assert result.exit_code == 2, result
        error = result.json()
        assert (error["contract"], error["code"]) == ("ait.runner.error.v1", code)
    assert "nope.json" in missing.json()["message"]
    assert not marker.exists()
    assert a_file.read_text() == "x"
    assert not (source / "attempts").exists()


def test_every_path_option_works_relative_to_the_working_directory(roots, monkeypatch):
    root, _attempts = roots
    make_source(root, "echo from-the-job\nexit 3\n")
    (root / "req.json").write_text(json.dumps(request("src")))
    monkeypatch.chdir(root)
    result = execute(
        b"",
        source_root=os.curdir,
        attempt_root="rel-attempts",
        extra=("--request", "req.json"),
    )
    assert result.exit_code == 1, result
    document = result.json()
    assert (document["status"], document["exit_code"]) == ("command_failed", 3)
    assert tail(document["evidence"]["stdout"]) == "from-the-job\n"
    assert list((root / "rel-attempts").iterdir()) == []


def test_a_short_secret_is_masked_too(roots):
    root, attempts = roots
    source = make_source(root, 'echo "pin=$PIN"\n')
    document = request(
        source, command={"environment": {"PIN": "hk4#q"}, "secret_environment": ["PIN"]}
    )
    result = execute(document, source_root=root, attempt_root=attempts)
    assert result.exit_code == 0, result
    stdout = result.json()["evidence"]["stdout"]
    assert tail(stdout) == "pin=***\n"
    assert stdout["masked"] is True


def alive_with_argument(argument: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if argument.encode() in argv and state != b"Z":
            found.append(int(entry))
    return found


def test_descendants_that_shed_group_environment_and_parent_do_not_survive(roots):
    root, attempts = roots
    first, second = f"{300 + os.getpid() % 97}.25", f"{300 + os.getpid() % 89}.75"
    escape = (
        "import os\\n"
        "if os.fork() == 0:\\n"
        "    os.setsid()\\n"
        "    if os.fork() == 0:\\n"
        f"        os.execve('/bin/sleep', ['sleep', '{second}'], {{}})\\n"
        "    os._exit(0)\\n"
    )
    script = f'setsid env -i sleep {first} &\npython3 -c "{escape}"\nsleep 0.3\n'
    source = make_source(root, script)
    result = execute(
        request(source),
        source_root=root,
        attempt_root=attempts,
        extra=("--drain-timeout-ms", "500"),
    )
    assert result.exit_code == 0, result
    assert alive_with_argument(first) == []
    assert alive_with_argument(second) == []
    assert result.json()["termination"]["leftover_processes_killed"] >= 1


def test_a_killed_runners_attempt_cgroup_is_swept_by_the_next_run(roots):
    """SIGKILL gives a runner no chance to end its attempt: what its job started lives
    on in the attempt's cgroup until the next attempt sweeps cgroups whose creator is
    gone."""
    from aiworker.runtime.cgroups import AttemptCgroup

    probe = AttemptCgroup.create()
    if probe is None:
        pytest.skip("no writable cgroup2 hierarchy here")
    probe.remove()
    root, attempts = roots
    marker = f"{400 + os.getpid() % 97}.5"
    source = make_source(root, f"setsid env -i sleep {marker} &\nsleep {marker}\n")
    runner = subprocess.Popen(
        runner_argv(root, attempts),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    runner.stdin.write(json.dumps(request(source)).encode())
    runner.stdin.close()
    deadline = time.monotonic() + 30
    while len(alive_with_argument(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(alive_with_argument(marker)) == 2
    runner.kill()
    runner.wait()
    # (Any attempt starting now sweeps: with parallel tests, another may get there first.)
    quick = make_source(root, "exit 0\n", name="quick")
    assert execute(request(quick), source_root=root, attempt_root=attempts).exit_code == 0
    assert alive_with_argument(marker) == []


def test_a_marker_that_is_a_directory_costs_the_sweep_no_descriptor(roots):
    """A runner sweeps before every attempt: a refused marker must not leak the
    descriptor it was opened with, or a long-lived runner runs out of them."""
    from aiworker.runtime.attempts import sweep_stale_attempts

    _, attempts = roots
    (attempts / "attempt-odd" / ".aiworker-attempt.json").mkdir(parents=True)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        sweep_stale_attempts(attempts)
    assert len(os.listdir("/proc/self/fd")) == before
