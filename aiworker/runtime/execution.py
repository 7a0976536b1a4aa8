"""Run one job to completion under a wall-clock deadline, with bounded evidence.

One loop polls the job's two pipes and a pidfd for its exit. At the deadline
the whole attempt gets SIGTERM, then SIGKILL after a grace period; when the job
exits but a leftover descendant keeps the pipes open, draining stops after a
bounded time. Either way every process of the attempt is killed before the
outcome is returned. Progress is reported through the on_event callback.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiworker.runtime.cgroups import AttemptCgroup
from aiworker.runtime.evidence import DEFAULT_TAIL_BYTES, StreamDigest, StreamRecorder
from aiworker.runtime.processes import start_process_group
from aiworker.runtime.reaper import (
    attempt_processes,
    become_subreaper,
    kill_attempt,
    reap_children,
    signal_all,
)

F_SETPIPE_SZ = 1031
READ_SIZE = 1 << 20
EventSink = Callable[[str, Mapping[str, Any]], None]


@dataclass(frozen=True)
class Limits:
    timeout_s: float
    kill_grace_s: float = 10.0
    drain_timeout_s: float = 10.0
    tail_bytes: int = DEFAULT_TAIL_BYTES
    # Where each stream's first LOG_BYTES bytes are kept (stdout.log, stderr.log): the
    # logs a runner sends to the artifact store. None: only the tails are kept.
    log_dir: Path | None = None
    log_bytes: int = 0


@dataclass
class Outcome:
    exit_code: int | None
    signal: str | None
    timed_out: bool
    spawn_error: str | None
    stdout: StreamDigest
    stderr: StreamDigest
    started_at: datetime
    finished_at: datetime
    duration_ms: int
    signals_sent: list[str] = field(default_factory=list)
    # A signal was sent while the process still ran (its timeout, a cancel); one sent only
    # to what it left holding its output, after it ended, is not why it ended.
    signalled_running: bool = False
    drain_timed_out: bool = False
    leftover_processes_killed: int = 0


def _ignore(_kind: str, _data: Mapping[str, Any]) -> None:
    return None


def run_job(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    limits: Limits,
    tag: str,
    secrets: Sequence[bytes] = (),
    on_event: EventSink = _ignore,
    stdin_path: Path | None = None,
    cancel: threading.Event | None = None,
) -> Outcome:
    """Run ARGV; TAG (NAME=VALUE) must be in ENV so escaped processes can be found. Setting
    CANCEL kills the job at once (SIGKILL, no grace), reported as timed out."""
    become_subreaper()
    out, err = (
        StreamRecorder(
            limits.tail_bytes,
            limits.log_dir / f"{name}.log" if limits.log_dir else None,
            limits.log_bytes,
        )
        for name in ("stdout", "stderr")
    )
    try:
        return _run(argv, cwd, env, limits, tag, secrets, on_event, stdin_path, cancel, out, err)
    except BaseException:
        out.discard()  # nothing of an attempt that did not end is kept
        err.discard()
        raise


def _run(
    argv: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    limits: Limits,
    tag: str,
    secrets: Sequence[bytes],
    on_event: EventSink,
    stdin_path: Path | None,
    cancel: threading.Event | None,
    out: StreamRecorder,
    err: StreamRecorder,
) -> Outcome:
    started_at = datetime.now(UTC)
    started = time.monotonic()
    cgroup = AttemptCgroup.create()
    join_fd = cgroup.open_procs() if cgroup is not None else None
    try:
        proc = start_process_group(argv, cwd=cwd, env=env, stdin_path=stdin_path, join_fd=join_fd)
    except OSError as exc:
        if cgroup is not None:
            cgroup.remove()
        on_event("spawn_failed", {"error": exc.strerror or str(exc)})
        return _outcome(
            None, None, False, exc.strerror or str(exc), out, err, secrets, started_at, started
        )
    finally:
        if join_fd is not None:
            os.close(join_fd)
    on_event("started", {"pid": proc.pid})
    loop = _Loop(proc.pid, limits, tag.encode(), on_event, cancel)
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        loop.pump({proc.stdout.fileno(): out, proc.stderr.fileno(): err}, proc.poll, started)
    except BaseException:
        # Interrupted (a signal turned into an exception, an error in a callback): the
        # attempt must not outlive the runner that owns it.
        kill_attempt(proc.pid, proc.pid, loop.tag)
        _end_cgroup(cgroup, proc.pid)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        raise
    returncode = proc.wait()
    # Whatever is left now escaped the job; nothing of the attempt may outlive us.
    loop.leftovers += kill_attempt(proc.pid, proc.pid, loop.tag)
    loop.leftovers += _end_cgroup(cgroup, proc.pid)
    proc.stdout.close()
    proc.stderr.close()
    code, sig = (None, signal.Signals(-returncode).name) if returncode < 0 else (returncode, None)
    on_event("finished", {"exit_code": code, "signal": sig, "timed_out": loop.timed_out})
    outcome = _outcome(code, sig, loop.timed_out, None, out, err, secrets, started_at, started)
    outcome.signals_sent = loop.signals_sent
    outcome.signalled_running = loop.signalled_running
    outcome.drain_timed_out = loop.drain_timed_out
    outcome.leftover_processes_killed = loop.leftovers
    return outcome


def _end_cgroup(cgroup: AttemptCgroup | None, job_pid: int) -> int:
    """Kill what is left in the attempt's cgroup (what shed its group, environment and
    parent), reap it, and remove the cgroup; return how many were killed."""
    if cgroup is None:
        return 0
    killed = cgroup.kill()
    cgroup.remove(reap=lambda: reap_children(exclude=job_pid))
    return killed


def _outcome(
    code: int | None,
    sig: str | None,
    timed_out: bool,
    spawn_error: str | None,
    out: StreamRecorder,
    err: StreamRecorder,
    secrets: Sequence[bytes],
    started_at: datetime,
    started: float,
) -> Outcome:
    return Outcome(
        exit_code=code,
        signal=sig,
        timed_out=timed_out,
        spawn_error=spawn_error,
        stdout=out.finish(list(secrets)),
        stderr=err.finish(list(secrets)),
        started_at=started_at,
        finished_at=datetime.now(UTC),
        duration_ms=int((time.monotonic() - started) * 1000),
    )


class _Loop:
    def __init__(
        self,
        pid: int,
        limits: Limits,
        tag: bytes,
        on_event: EventSink,
        cancel: threading.Event | None = None,
    ) -> None:
        self.pid = pid
        self.cancel = cancel
        self.cancelled = False
        self.limits = limits
        self.tag = tag
        self.on_event = on_event
        self.timed_out = False
        self.drain_timed_out = False
        self.signals_sent: list[str] = []
        self.signalled_running = False
        self.leftovers = 0
        self.exited = False
        self.deadline = 0.0
        self.kill_at: float | None = None
        self.drain_until: float | None = None

    def pump(
        self,
        pipes: dict[int, StreamRecorder],
        poll_exit: Callable[[], int | None],
        started: float,
    ) -> None:
        poller = select.poll()
        for fd in pipes:
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, F_SETPIPE_SZ, READ_SIZE)
            poller.register(fd, select.POLLIN)
        pidfd = _pidfd(self.pid)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        self.deadline = started + self.limits.timeout_s
        try:
            while True:
                now = time.monotonic()
                if not self.exited and poll_exit() is not None:
                    self.exited = True
                    self.drain_until = now + self.limits.drain_timeout_s
                    self.on_event("exited", {})
                if self.exited and not pipes:
                    break
                if not self._advance_deadlines(now, bool(pipes)):
                    break
                waits = [t for t in (self.deadline, self.kill_at, self.drain_until) if t]
                timeout = max(0.0, min([*waits, now + 0.25]) - now)
                for fd, _event in poller.poll(timeout * 1000):
                    if fd == pidfd:
                        poller.unregister(pidfd)
                        continue
                    chunk = os.read(fd, READ_SIZE)
                    if chunk:
                        pipes[fd].feed(chunk)
                    else:
                        poller.unregister(fd)
                        del pipes[fd]
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _advance_deadlines(self, now: float, output_open: bool) -> bool:
        """Act on whichever deadline has passed; False when draining must stop."""
        if self.cancel is not None and self.cancel.is_set() and not self.cancelled:
            # Cancelled (the lease is gone): no grace, the job may be someone else's now.
            self.cancelled = self.timed_out = True
            self._kill("cancelled")
            self.kill_at = None
            self.drain_until = now + min(self.limits.drain_timeout_s, 1.0)
        if not self.timed_out and not self.exited and now >= self.deadline:
            self._terminate()
            self.kill_at = now + self.limits.kill_grace_s
        if self.kill_at is not None and now >= self.kill_at:
            self._kill("grace period over")
            self.kill_at = None
            self.drain_until = now + min(self.limits.drain_timeout_s, 1.0)
        if self.drain_until is not None and now >= self.drain_until and output_open:
            self.drain_timed_out = True
            self._kill("output still open after the job exited")
            return False
        return True

    def _terminate(self) -> None:
        self.timed_out = True
        self.on_event("timeout", {"timeout_s": self.limits.timeout_s})
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGTERM)
        signal_all(attempt_processes(os.getpid(), self.pid, self.pid, self.tag), signal.SIGTERM)
        self.signals_sent.append("SIGTERM")
        self.signalled_running = self.signalled_running or not self.exited

    def _kill(self, reason: str) -> None:
        self.on_event("kill", {"reason": reason})
        self.leftovers += kill_attempt(self.pid, self.pid, self.tag)
        self.signals_sent.append("SIGKILL")
        self.signalled_running = self.signalled_running or not self.exited


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
