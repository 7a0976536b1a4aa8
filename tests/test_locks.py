"""Named flock locks across real processes: exclusion, holder pid, release on death."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from aiworker.errors import InvalidInput, LockHeld
from aiworker.runtime.locks import SETTLE_SECONDS, LockDir


def test_lock_excludes_other_processes_and_names_the_holder(state_dir, hold_in_child):
    child = hold_in_child(state_dir, "discovery")
    lock = LockDir(state_dir).lock("discovery")
    assert not lock.try_acquire()
    assert lock.is_locked()
    assert lock.holder_pid() == child.pid
    with pytest.raises(LockHeld, match=f"by pid {child.pid}"):
        lock.acquire(timeout=0.2)


def test_lock_is_released_when_the_holder_dies(state_dir, hold_in_child):
    child = hold_in_child(state_dir, "slot-1")
    lock = LockDir(state_dir).slot(1)
    assert lock.is_locked()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert not lock.is_locked()
    assert lock.holder_pid() is None
    assert lock.try_acquire()
    assert lock.holder_pid() == os.getpid()
    lock.release()


# A job killed in the instant after it forked: the child shares the lock's descriptor
# until it execs (close-on-exec) or exits. Here it keeps it until its stdin closes.
FORKING_HOLDER = """
import os, sys, time
from pathlib import Path
from aiworker.runtime.locks import SETTLE_SECONDS, LockDir
lock = LockDir(Path(sys.argv[1])).lock(sys.argv[2])
assert lock.try_acquire()
child = os.fork()
if child == 0:
    os.read(0, 1)
    os._exit(0)
print(child, flush=True)
time.sleep(600)
"""


def test_a_killed_holders_forked_child_is_waited_for_not_taken_for_the_holder(state_dir):
    holder = subprocess.Popen(
        [sys.executable, "-c", FORKING_HOLDER, str(state_dir), "slot-1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    straggler = int(holder.stdout.readline())
    assert straggler > 0
    holder.kill()
    holder.wait()
    holder.stdout.close()
    lock = LockDir(state_dir).slot(1)
    # The kernel still sees the lock held: by the straggler, not by the dead holder.
    with open(lock.path) as probe, pytest.raises(BlockingIOError):
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert lock.path.read_text().strip() == str(holder.pid)
    threading.Timer(0.3, holder.stdin.close).start()
    assert lock.try_acquire(), "the straggler lets go within the settle time"
    assert lock.holder_pid() == os.getpid()
    lock.release()
    assert not lock.is_locked()


def test_a_live_holders_lock_is_reported_held_at_once(state_dir, hold_in_child):
    child = hold_in_child(state_dir, "slot-2")
    lock = LockDir(state_dir).slot(2)
    started = time.monotonic()
    assert not lock.try_acquire()
    assert lock.is_locked()
    # Only a dead recorded holder is waited for: a live one is answered without the wait.
    assert time.monotonic() - started < SETTLE_SECONDS
    assert lock.holder_pid() == child.pid


def test_blocking_acquire_waits_for_release(state_dir, hold_in_child):
    child = hold_in_child(state_dir, "maintenance")
    started = time.monotonic()
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.3; kill {child.pid}"])
    lock = LockDir(state_dir).lock("maintenance")
    lock.acquire(timeout=10)
    waited = time.monotonic() - started
    killer.wait()
    assert lock.held
    assert waited >= 0.25
    lock.release()
    assert not lock.is_locked()


def test_context_manager_raises_when_held(state_dir):
    locks = LockDir(state_dir)
    with locks.held("discovery"), pytest.raises(LockHeld), locks.held("discovery"):
        pass
    with locks.held("discovery"):
        pass


def test_lock_files_are_private(state_dir):
    with LockDir(state_dir).held("discovery"):
        pass
    assert (state_dir / "locks").stat().st_mode & 0o777 == 0o700
    assert (state_dir / "locks" / "discovery.lock").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("name", ["../escape", "", "UPPER", "a/b"])
def test_invalid_lock_names_are_refused(state_dir, name):
    with pytest.raises(InvalidInput):
        LockDir(state_dir).lock(name)


def test_sharers_keep_out_an_exclusive_holder_and_not_each_other(state_dir, hold_in_child):
    hold_in_child(state_dir, "maintenance", shared=True)
    locks = LockDir(state_dir)
    second = locks.lock("maintenance")
    assert second.try_share()  # a second tick runs beside the first
    assert not locks.lock("maintenance").try_acquire()
    assert not locks.lock("maintenance").is_locked()  # shared: no maintenance in progress
    second.release()


def test_maintenance_waits_for_a_tick_but_not_for_another_maintenance(state_dir, hold_in_child):
    tick = hold_in_child(state_dir, "maintenance", shared=True)
    killer = subprocess.Popen(["sh", "-c", f"sleep 0.5; kill {tick.pid}"])
    started = time.monotonic()
    lock = LockDir(state_dir).maintenance()
    killer.wait()
    assert lock.held
    assert time.monotonic() - started >= 0.4
    lock.release()
    holder = hold_in_child(state_dir, "maintenance")
    started = time.monotonic()
    with pytest.raises(LockHeld, match="another maintenance operation"):
        LockDir(state_dir).maintenance()
    assert time.monotonic() - started < SETTLE_SECONDS  # a live holder: answered at once
    assert holder.poll() is None
