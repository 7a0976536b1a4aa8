"""The one place short helper subprocesses are started from (git, qemu-img, probes,
line-protocol servers)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiworker.runtime.logfiles import Rotation, rotate

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4


@functools.cache
def _prctl() -> Any:
    """libc's prctl, looked up once, in the parent (never between fork and exec); ctypes
    is imported only by the commands that start jobs."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def keep_memory_private() -> bool:
    """Make this process undumpable: other processes of the same user (the jobs it runs)
    can no longer read its memory or /proc/PID/environ, where a token it was given sits.
    Its children are dumpable again after their exec. Returns whether it took effect."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_command(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    input_text: str | None = None,
) -> CommandResult:
    """Run ARGV (never through a shell) and capture its output as text.

    A missing program or a timeout is reported as a failed result (127 / 124),
    never as an exception, so callers have one shape to handle.
    """
    try:
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        return CommandResult(tuple(argv), 127, "", f"{argv[0]}: not found")
    except subprocess.TimeoutExpired:
        return CommandResult(tuple(argv), 124, "", f"{argv[0]}: timed out after {timeout}s")
    return CommandResult(tuple(argv), done.returncode, done.stdout, done.stderr)


def process_alive(pid: int) -> bool:
    """True while PID exists and is not a zombie (a dead child not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


def _argv(pid: int) -> list[bytes]:
    """PID's command line while it is alive (none: gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if process_alive(pid) else []
    except OSError:
        return []


def runs_with_arguments(pid: int, *arguments: str) -> bool:
    """True while PID is alive and its command line holds ARGUMENTS in a row: a recorded
    pid is only trusted while it still runs the job it was recorded for (pids are reused)."""
    argv, wanted = _argv(pid), [a.encode() for a in arguments]
    return any(argv[i : i + len(wanted)] == wanted for i in range(len(argv)))


def which(program: str) -> str | None:
    return shutil.which(program)


def start_process_group(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin_path: Path | None = None,
    join_fd: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start a job in a new session (its own process group) with piped stdout and stderr.

    Direct argv, never a shell string; stdin is /dev/null; no file descriptor of
    ours leaks into the job.
    """
    stdin = open(stdin_path, "rb") if stdin_path is not None else None  # noqa: SIM115
    try:
        return _popen_group(argv, cwd, env, stdin, join_fd)
    finally:
        if stdin is not None:
            stdin.close()


def _popen_group(
    argv: Sequence[str], cwd: Path, env: Mapping[str, str], stdin: Any, join_fd: int | None
) -> subprocess.Popen[bytes]:
    # JOIN_FD, an open cgroup.procs: the child writes "0" to it between fork and exec, so
    # it is in its cgroup before it runs anything, and is exec'd exactly as it would be
    # otherwise. One os.write takes no lock another thread could hold across the fork.
    # The job is also killed if the thread that started it dies (a runner SIGKILLed
    # mid-job), so a job whose lease then expires never runs twice at once. prctl is
    # looked up before the fork; the call in the child is one system call.
    prctl = _prctl()

    def join() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if join_fd is not None:
            with contextlib.suppress(OSError):  # no cgroup then; the sweep still runs
                os.write(join_fd, b"0")

    return subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
        preexec_fn=join,  # noqa: PLW1509 - two system calls, no lock taken
    )


def run_interactive(argv: Sequence[str]) -> int:
    """ARGV on this terminal (an operator's shell); its exit status."""
    try:
        return subprocess.call(list(argv))
    except FileNotFoundError:
        return 127


def run_binary(
    argv: Sequence[str],
    *,
    input_bytes: bytes = b"",
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
) -> tuple[int, bytes, bytes]:
    """Run ARGV with binary stdin and stdout (CGI programs such as git http-backend)."""
    try:
        done = subprocess.run(
            list(argv),
            input=input_bytes,
            capture_output=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, b"", f"{argv[0]}: timed out after {timeout}s".encode()
    return done.returncode, done.stdout, done.stderr


def spawn_detached(
    argv: Sequence[str],
    *,
    log_path: Path,
    keep_fds: Sequence[int] = (),
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    rotation: Rotation | None = None,
) -> int:
    """Start ARGV in its own session, outliving us, with output appended to LOG_PATH
    (rotated first when it is past ROTATION's limit).

    KEEP_FDS stay open in the child (a slot lock travels this way); ENV is added to
    ours; return its pid.
    """
    log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if rotation is not None:
        rotate(log_path, rotation)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
            pass_fds=tuple(keep_fds),
            close_fds=True,
            cwd=cwd,
        )
    finally:
        os.close(fd)
    # Kept, not dropped: a dropped Popen whose child still runs warns in its __del__. The
    # child outlives us by design; finished ones are reaped here as new ones start.
    with _REAPING:  # threads that spawn at once keep each other's children
        _DETACHED[:] = [c for c in _DETACHED if c.poll() is None]
        _DETACHED.append(child)
    return child.pid


def still_running(pid: int) -> bool:
    """Whether PID, a child spawn_detached started, still runs (reaped if it ended)."""
    with _REAPING:
        return any(c.pid == pid and c.poll() is None for c in _DETACHED)


def spawn_tied(argv: Sequence[str], *, cwd: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """Start ARGV in its own session with output to LOG_PATH; it is SIGKILLed when the
    thread that started it dies (a guest of a killed job does not outlive it)."""
    prctl = _prctl()

    def tie() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            close_fds=True,
            preexec_fn=tie,  # noqa: PLW1509 - one system call, no lock taken
        )
    finally:
        os.close(fd)


_DETACHED: list[subprocess.Popen[bytes]] = []
_REAPING = threading.Lock()
# Collect the exit status of those that finished, so a long-lived caller leaves no zombie.
atexit.register(lambda: [child.poll() for child in _DETACHED])


def exec_keeping(argv: Sequence[str], keep_fd: int) -> None:
    """Replace this process with ARGV; KEEP_FD (a held lock) stays open across exec."""
    os.set_inheritable(keep_fd, True)
    os.execvp(argv[0], list(argv))  # noqa: S606 - direct argv by design, never a shell


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def tee_output(log_path: Path, rotation: Rotation | None = None) -> None:
    """Send this process's stdout and stderr (and so an exec'd program's) both where they
    went so far (a unit's journal) and, appended, to LOG_PATH, through `tee`. tee ignores
    the stop signals a unit's processes all get, so a stopping job can still write how
    it ended; it ends when the last writer closes its pipe (or with SIGKILL)."""
    log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if rotation is not None:
        rotate(log_path, rotation)
    os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    tee = subprocess.Popen(
        ["tee", "-a", str(log_path)],
        stdin=read_end,
        stdout=sys.stdout.fileno(),
        stderr=subprocess.DEVNULL,
        close_fds=True,
        preexec_fn=_ignore_stop_signals,  # noqa: PLW1509 - single-threaded here, before exec
    )
    _DETACHED.append(tee)
    os.close(read_end)
    os.dup2(write_end, sys.stdout.fileno())
    os.dup2(write_end, sys.stderr.fileno())
    os.close(write_end)


def converse(
    argv: Sequence[str],
    lines: Sequence[bytes],
    *,
    answered: Any,
    env: Mapping[str, str],
    timeout: float,
) -> CommandResult:
    """Send LINES to a line-protocol server (JSON-RPC on stdio) and keep its stdin open
    until ANSWERED(line) is true for a line it prints or TIMEOUT passes: a server may
    drop what it has not answered once its input closes. Then stdin is closed, the
    server has a moment to exit, and its whole session is killed, whatever happened.
    Exit status: 0 once answered, 124 at the deadline, else the server's own."""
    payload = b"".join(line.rstrip(b"\n") + b"\n" for line in lines)
    if len(payload) > PIPE_BUFFER:
        raise ValueError("converse sends at most one pipe buffer of requests")
    try:
        process = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError:
        return CommandResult(tuple(argv), 127, "", f"{argv[0]}: not found")
    out, err = bytearray(), bytearray()
    done = timed_out = False
    try:
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(payload)  # type: ignore[union-attr]
            process.stdin.flush()  # type: ignore[union-attr]
        done, timed_out = _read_until(process, out, err, answered, time.monotonic() + timeout)
    finally:
        with contextlib.suppress(BrokenPipeError, OSError):
            process.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=2)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, 9)  # what the server left behind in its session
        code = process.wait()
        process.stdout.close()  # type: ignore[union-attr]
        process.stderr.close()  # type: ignore[union-attr]
    status = 0 if done else 124 if timed_out else (code or 1)
    return CommandResult(
        tuple(argv), status, out.decode(errors="replace"), err.decode(errors="replace")
    )


PIPE_BUFFER = 64 * 1024


def _read_until(
    process: subprocess.Popen[bytes],
    out: bytearray,
    err: bytearray,
    answered: Any,
    deadline: float,
) -> tuple[bool, bool]:
    """Collect stdout and stderr until a stdout line is ANSWERED, both close, or the
    DEADLINE; return (answered, deadline reached)."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, out)  # type: ignore[arg-type]
        selector.register(process.stderr, selectors.EVENT_READ, err)  # type: ignore[arg-type]
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return False, True
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                start = len(key.data)
                key.data.extend(chunk)
                if key.data is out:
                    complete = out[out.rfind(b"\n", 0, start) + 1 :].split(b"\n")[:-1]
                    if any(answered(line) for line in complete):
                        return True, False
    return False, False
