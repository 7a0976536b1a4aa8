"""Logs that last: every line a job or tick writes to its log file is stamped with UTC
time and names its task and attempt; the files are rotated by size; under systemd
records go to the journal with those ids as fields."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

from tests.delivery_fixtures import write_scenario
from tests.helpers import configure, run_process
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc

STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")
MIB = 1024 * 1024


def wait_for_state(db, state, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query(db, "select state from tasks") == [(state,)]:
            return
        time.sleep(0.2)
    raise AssertionError(f"the task never reached {state}: {query(db, 'select state from tasks')}")


def test_a_jobs_log_is_stamped_names_its_task_and_attempt_and_is_rotated(
    forge, upgraded, state_dir, tmp_path, monkeypatch, cli
):
    config = configure(tmp_path, forge, monkeypatch)
    write_scenario(tmp_path / "scenario.json", edits={"calc.py": FIX}, result=result_doc())
    rotation = "[housekeeping]\nlog_max_mib = 1\nlog_keep = 2\n"
    config.write_text(SCRIPT_ONLY + "\n" + config.read_text() + rotation)
    assert cli("poll").exit_code == 0
    logs = state_dir / "logs"
    logs.mkdir(mode=0o700)
    (logs / "task-1.log").write_text("old line\n" * (MIB // 9 + 1))  # past 1 MiB
    (logs / "task-1.log.1").write_text("older\n")
    (logs / "task-1.log.2").write_text("oldest\n")
    ticked = run_process("--json", "scheduler", "tick")
    assert ticked.exit_code == 0, ticked
    assert [s["task"] for s in ticked.json()["started"]] == [1]
    wait_for_state(upgraded, "implemented")
    # Rotated once, as the job's output opened it: the oldest went, the others moved up.
    assert (logs / "task-1.log.1").read_text().startswith("old line\n")
    assert (logs / "task-1.log.2").read_text() == "older\n"
    assert not (logs / "task-1.log.3").exists()
    deadline = time.monotonic() + 30
    while "implementation attempt 1 succeeded" not in (logs / "task-1.log").read_text():
        assert time.monotonic() < deadline, (logs / "task-1.log").read_text()
        time.sleep(0.2)
    lines = (logs / "task-1.log").read_text().splitlines()
    assert all(STAMPED.match(line) for line in lines), lines
    started = [line for line in lines if "implementation attempt 1 started (script)" in line]
    assert len(started) == 1, lines
    assert " task=1 attempt=1 run=" in started[0]
    [taken_up] = [line for line in lines if "task 1: claimed -> running: implementing" in line]
    assert " task=1 run=" in taken_up  # named from the job's first record on
    # A first fetch into the git cache, the one long step of a job, says so as it starts.
    assert any("repository 1: a first fetch, of its whole history" in line for line in lines)


def test_a_tick_started_for_a_follow_up_writes_stamped_lines_to_the_scheduler_log(
    upgraded, state_dir
):
    asked = run_process("--json", "scheduler", "start-now")
    assert asked.exit_code == 0, asked
    log = state_dir / "logs" / "scheduler.log"
    deadline = time.monotonic() + 60
    while "tick: " not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.2)
    lines = log.read_text().splitlines()
    assert all(STAMPED.match(line) for line in lines), lines


def test_under_systemd_records_go_to_the_journal_with_their_ids_as_fields(upgraded, tmp_path):
    journal = tmp_path / "journal.socket"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(journal))
    receiver.settimeout(30)
    stderr = tmp_path / "stderr"
    with stderr.open("w") as handle:
        info = os.fstat(handle.fileno())
        env = {
            **os.environ,
            "JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}",  # as systemd sets it
            "AIWORKER_JOURNAL_SOCKET": str(journal),
        }
        done = subprocess.run(
            [sys.executable, "-m", "aiworker", "scheduler", "tick"],
            stdout=subprocess.DEVNULL,
            stderr=handle,
            env=env,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, stderr.read_text()
    fields: dict[str, str] = {}
    while not fields.get("MESSAGE", "").startswith("tick: "):  # the tick's own summary
        datagram = receiver.recv(65536).decode()
        fields = dict(line.split("=", 1) for line in datagram.splitlines())
    receiver.close()
    assert fields["SYSLOG_IDENTIFIER"] == "aiworker"
    assert fields["PRIORITY"] == "6"
    assert fields["MESSAGE"].startswith("tick: ")
    assert re.fullmatch(r"[0-9a-f]{12}", fields["AIWORKER_RUN"])
    assert stderr.read_text() == ""  # nothing went to stderr instead
