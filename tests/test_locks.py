"""Named flock locks across real processes: exclusion, holder pid, release on death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from aiworker.errors import InvalidInput, LockHeld
from aiworker.runtime.locks import LockDir

HOLDER = """
import sys, time
from pathlib import Path
from aiworker.runtime.locks import LockDir
lock = LockDir(Path(sys.argv[1])).lock(sys.argv[2])
assert lock.try_acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def hold_in_child():
    children = []

    def start(state_dir, name):
        child = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(state_dir), name], stdout=subprocess.PIPE, text=True
        )
        children.append(child)
        assert child.stdout.readline().strip() == "held"
        return child

    yield start
    for child in children:
        child.kill()
        child.wait()
        child.stdout.close()


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
