"""The one place short helper subprocesses are started from (git, qemu-img, probes)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


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


def which(program: str) -> str | None:
    return shutil.which(program)


def start_process_group(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    """Start a job in a new session (its own process group) with piped stdout and stderr.

    Direct argv, never a shell string; stdin is /dev/null; no file descriptor of
    ours leaks into the job.
    """
    return subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )


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
