"""Helpers shared by the tests: results of CLI runs, a CLI process, a forge-backed config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def json(self) -> Any:
        return json.loads(self.stdout)

    def __repr__(self) -> str:
        return f"Result(exit_code={self.exit_code}, stdout={self.stdout!r}, stderr={self.stderr!r})"


def run_process(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Result:
    """Run the CLI as a real separate process."""
    done = subprocess.run(
        [sys.executable, "-m", "aiworker", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)


def configure(tmp_path, forge, monkeypatch, *, operator=True):
    roles = {"planner": "planner-bot", "worker": "worker-bot", "reviewer": "reviewer-bot"}
    if operator:
        roles["operator"] = "admin"
    lines = [f'[forge]\nurl = "{forge.url}"']
    for role, login in roles.items():
        variable = f"AIWORKER_TEST_{role.upper()}_TOKEN"
        monkeypatch.setenv(variable, forge.tokens[login])
        lines.append(f'[forge.identities.{role}]\ntoken_env = "{variable}"')
    lines.append('[[repositories]]\nindex = 1\nowner = "team"\nname = "app"')
    path = tmp_path / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("AIWORKER_CONFIG", str(path))
    return path


def worker_token_from_file(config: Path, token: Path) -> None:
    """The configuration CONFIG (as configure() wrote it) reads the worker's token from
    the file TOKEN instead of its variable."""
    text = config.read_text().replace(
        'token_env = "AIWORKER_TEST_WORKER_TOKEN"', f'token_file = "{token}"'
    )
    config.write_text(text)


def at_terminal(*args: str, columns: int = 80, rows: int = 24, timeout: float = 60) -> str:
    """The CLI's output in a pseudo-terminal of COLUMNS x ROWS, colours stripped."""
    import fcntl
    import pty
    import re
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    process = subprocess.Popen(
        [sys.executable, "-m", "aiworker", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**env, "TERM": "xterm-256color"},
    )
    os.close(slave)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other end closed: the command ended
                break
            if not chunk:
                break
            output += chunk
    finally:
        process.kill()
        process.wait()
        os.close(master)
    text = output.decode(errors="replace").replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
