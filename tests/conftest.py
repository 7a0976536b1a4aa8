"""The fixed harness: state and config under tmp_path, plain output, helpers to run the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aiworker.cli import main
from tests.forge_fixtures import forge  # noqa: F401 - shared fixture

REPO_ROOT = Path(__file__).resolve().parent.parent


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


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "state"
    monkeypatch.setenv("AIWORKER_STATE_DIR", str(state))
    monkeypatch.delenv("AIWORKER_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "80")
    return state


@pytest.fixture
def state_dir(isolated_environment: Path) -> Path:
    return isolated_environment


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run the CLI in this process, as the console script does."""

    def run(*args: str) -> Result:
        code = main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


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


@pytest.fixture
def upgraded(cli, state_dir: Path) -> Path:
    """A state directory whose database is at head; returns the database path."""
    result = cli("db", "upgrade")
    assert result.exit_code == 0, result
    return state_dir / "aiworker.db"
