"""A cgroup per attempt, where this host lets us make one.

A process can leave its process group (setsid), clear its environment (env -i)
and double-fork away from its parent, but it cannot leave its cgroup. When a
cgroup2 hierarchy is mounted and writable (root, or a delegated subtree), each
attempt's job joins a fresh child cgroup between fork and exec (so it runs
nothing outside it, and is exec'd exactly as without a cgroup), and everything in
it is killed at the end with one write to cgroup.kill. Where no cgroup can be
made, the runner's subreaper sweep (reaper.py) is what remains.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from aiworker.runtime.processes import process_alive

_SEQUENCE = itertools.count()


def cgroup2_mount() -> Path | None:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "-" in fields and fields[fields.index("-") + 1] == "cgroup2":
            return Path(fields[4])
    return None


def own_cgroup() -> str:
    """This process's cgroup2 path (the "0::" line), relative to the mount."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].lstrip("/")
    return ""


@dataclass(frozen=True)
class AttemptCgroup:
    path: Path

    @classmethod
    def create(cls) -> AttemptCgroup | None:
        """A fresh cgroup for one attempt, or None where none can be made here."""
        mount = cgroup2_mount()
        if mount is None:
            return None
        parent = mount / own_cgroup() / "aiworker"
        sweep_orphans(parent)
        name = f"attempt-{os.getpid()}-{next(_SEQUENCE)}-{time.monotonic_ns()}"
        path = parent / name
        try:
            path.mkdir(parents=True)
            if not os.access(path / "cgroup.procs", os.W_OK):
                path.rmdir()
                return None
        except OSError:
            return None
        return cls(path)

    def open_procs(self) -> int | None:
        """cgroup.procs opened for writing, for a child to join with (see processes.py)."""
        try:
            return os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return None

    def pids(self) -> list[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def kill(self) -> int:
        """Kill everything in the cgroup; return how many processes were in it."""
        found = self.pids()
        if not found:
            return 0
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:  # kernels before 5.14: one by one
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        return len(found)

    def remove(self, reap: object = None) -> bool:
        """Remove the (emptied) cgroup; killed processes leave it once reaped."""
        for _ in range(200):
            if callable(reap):
                reap()
            try:
                self.path.rmdir()
                return True
            except OSError:
                time.sleep(0.01)
        return False


def sweep_orphans(parent: Path) -> list[str]:
    """Kill and remove the attempt cgroups whose creator is gone (a runner or job killed
    before it could end its attempt); return their names. A live creator's cgroups, and
    anything not named like an attempt's, are left alone."""
    swept: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return swept
    for name in names:
        creator = name.split("-")[1] if name.startswith("attempt-") else ""
        if not creator.isdigit() or process_alive(int(creator)):
            continue
        orphan = AttemptCgroup(parent / name)
        orphan.kill()
        if orphan.remove():
            swept.append(name)
    return swept
