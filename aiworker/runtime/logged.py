"""A long command whose output is written to its log as it comes (`tail -f` follows it)
and handed line by line to whoever shows progress, never held in memory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

TAIL_LINES = 20
STOP_GRACE_S = 10.0  # for a stopped build to undo what it did, before it is killed


@dataclass(frozen=True)
class LoggedRun:
    exit_code: int | None  # None: it ran past its timeout and was killed
    tail: str  # its last lines, for an error message

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def run_logged(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log_path: Path,
    timeout: float,
    on_line: Callable[[str], None] | None = None,
) -> LoggedRun:
    """ARGV (in its own session) with stdout and stderr appended to LOG_PATH (0600) line
    by line; past TIMEOUT seconds its whole group is killed."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    last: deque[str] = deque(maxlen=TAIL_LINES)
    with os.fdopen(fd, "ab", buffering=0) as log:
        try:
            process = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            return LoggedRun(127, f"{argv[0]}: {exc.strerror or exc}")
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, expire)
        timer.start()
        try:
            assert process.stdout is not None
            for raw in process.stdout:
                log.write(raw)
                line = raw.decode(errors="replace").rstrip()
                last.append(line)
                if on_line is not None and line:
                    on_line(line)
            code = process.wait()
        finally:
            timer.cancel()
            if process.poll() is None:  # this process was stopped (a signal): the build too
                _stop(process, expire, log)
            if process.stdout is not None:
                process.stdout.close()
    return LoggedRun(None if expired.is_set() else code, "\n".join(last))


def _stop(process: subprocess.Popen[bytes], kill: Callable[[], None], log: BinaryIO) -> None:
    """SIGTERM to PROCESS's group, so that what it runs can clean up after itself (undo
    its mounts), then KILL once STOP_GRACE_S have passed. What it prints meanwhile goes
    on to LOG: a clean-up never waits on a full pipe."""

    def drain() -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in process.stdout or ():
                log.write(raw)

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    try:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    finally:  # a second signal cuts the grace short, never the kill
        if process.poll() is None:
            kill()
            process.wait()
        drainer.join(timeout=5)  # the pipe's end, once whatever held it open ended
