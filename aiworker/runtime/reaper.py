"""Finding and killing every process of an attempt, including ones that escaped.

A job may leave its process group (setsid) or double-fork. The runner makes
itself a child subreaper, so such orphans are re-parented to it instead of to
init and stay its descendants; each process also carries the attempt's id in
its environment. A sweep kills descendants of the runner that are in the job's
process group, descend from the job, or carry the attempt tag, until none are
left, and reaps the ones re-parented to us.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
PROC = Path("/proc")


def become_subreaper() -> bool:
    """Ask the kernel to re-parent our orphaned descendants to us (Linux 3.4+)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    pgid: int


def _read_stat(pid: int) -> ProcessInfo | None:
    try:
        raw = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name is in parentheses and may contain anything; parse after it.
    rest = raw[raw.rfind(b")") + 2 :].split()
    if len(rest) < 3 or rest[0] == b"Z":
        return None  # zombies hold no resources and cannot be killed again
    return ProcessInfo(pid, int(rest[1]), int(rest[2]))


def list_processes() -> list[ProcessInfo]:
    infos = []
    for entry in os.scandir(PROC):
        if entry.name.isdigit():
            info = _read_stat(int(entry.name))
            if info is not None:
                infos.append(info)
    return infos


def _has_tag(pid: int, tag: bytes) -> bool:
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return tag in environ.split(b"\0")


def attempt_processes(root_pid: int, job_pid: int, pgid: int, tag: bytes) -> list[int]:
    """Live descendants of ROOT_PID that belong to the attempt started as JOB_PID."""
    infos = list_processes()
    children: dict[int, list[int]] = {}
    for info in infos:
        children.setdefault(info.ppid, []).append(info.pid)
    by_pid = {info.pid: info for info in infos}
    descendants_of_runner = _descendants(root_pid, children)
    descendants_of_job = _descendants(job_pid, children) | {job_pid}
    found = []
    for pid in descendants_of_runner:
        member = by_pid.get(pid)
        if member is None:
            continue
        if pid in descendants_of_job or member.pgid == pgid or _has_tag(pid, tag):
            found.append(pid)
    return found


def _descendants(pid: int, children: dict[int, list[int]]) -> set[int]:
    seen: set[int] = set()
    stack = list(children.get(pid, []))
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(children.get(current, []))
    return seen


def signal_all(pids: Iterable[int], sig: int) -> int:
    sent = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            sent += 1
    return sent


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def reap_children(exclude: int | None = None) -> None:
    """Collect exit statuses of re-parented orphans so they do not linger as zombies."""
    for info in list_processes_including_zombies():
        if info.ppid == os.getpid() and info.pid != exclude:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.pid, os.WNOHANG)


def list_processes_including_zombies() -> list[ProcessInfo]:
    infos = []
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            raw = (PROC / entry.name / "stat").read_bytes()
        except OSError:
            continue
        rest = raw[raw.rfind(b")") + 2 :].split()
        if len(rest) >= 3:
            infos.append(ProcessInfo(int(entry.name), int(rest[1]), int(rest[2])))
    return infos


def kill_attempt(job_pid: int, pgid: int, tag: bytes, rounds: int = 50) -> int:
    """SIGKILL every process of the attempt until none is left; return how many were hit."""
    killed: set[int] = set()
    for _ in range(rounds):
        pids = attempt_processes(os.getpid(), job_pid, pgid, tag)
        signal_group(pgid, signal.SIGKILL)
        if not pids:
            break
        # Stop first, so a forking process cannot outrun the kill.
        signal_all(pids, signal.SIGSTOP)
        signal_all(pids, signal.SIGKILL)
        killed.update(pids)
        reap_children(exclude=job_pid)
        time.sleep(0.01)
    reap_children(exclude=job_pid)
    return len(killed - {job_pid})


def process_tree(pid: int) -> set[int]:
    """PID and every live descendant of it, whatever session or group they moved to."""
    children: dict[int, list[int]] = {}
    for info in list_processes():
        children.setdefault(info.ppid, []).append(info.pid)
    return {pid, *_descendants(pid, children)} if (PROC / str(pid)).exists() else set()


def tagged_processes(tag: bytes) -> list[int]:
    """Live processes whose environment carries TAG (NAME=VALUE)."""
    return [info.pid for info in list_processes() if _has_tag(info.pid, tag)]
