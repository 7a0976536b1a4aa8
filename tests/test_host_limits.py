"""What a real host's limits do to a job: a provider the kernel kills for its memory, a
check the host cannot start for want of file descriptors. Each is the host's, not the
work's: the task is tried again within its budget, and the reason says what happened."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from tests.delivery_fixtures import script_installation
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
    assert outcome == "transient"
    assert "killed by SIGKILL from outside aiworker" in reason
    assert "out-of-memory" in reason
    assert refunded == 0  # inference ran: the try counts against the budget
    assert query(upgraded, "select state from tasks") == [("ready",)]
    assert query(upgraded, "select used from budgets where phase = 'implementation'") == [(1,)]
