"""Helpers for runner tests: sources with a ci/run.sh and a real `runner execute` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import Result


def make_source(root: Path, script: str, name: str = "src") -> Path:
    source = root / name
    (source / "ci").mkdir(parents=True)
    entry = source / "ci" / "run.sh"
    entry.write_text("#!/bin/sh\n" + script)
    entry.chmod(0o755)
    return source


def request(source: Path | str, **overrides) -> dict:
    command = overrides.pop("command", {})
    document = {
        "contract": "ait.runner.native-job.v3",
        "label": "unit",
        "source": {"kind": "local_directory", "path": str(source)},
        "command": {"argv": ["./ci/run"], **command},
        "timeout_ms": 30_000,
        "suite_id": "suite-1",
    }
    document.update(overrides)
    return document


def runner_argv(source_root: Path, attempt_root: Path, *extra: str) -> list[str]:
    """`aiworker runner execute` as a user runs it."""
    return [
        sys.executable,
        "-m",
        "aiworker",
        "runner",
        "execute",
        "--source-root",
        str(source_root),
        "--attempt-root",
        str(attempt_root),
        *extra,
    ]


def execute(
    document: dict | bytes,
    *,
    source_root: Path,
    attempt_root: Path,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> Result:
    raw = document if isinstance(document, bytes) else json.dumps(document).encode()
    done = subprocess.run(
        runner_argv(source_root, attempt_root, *extra),
        input=raw,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    return Result(done.returncode, done.stdout.decode(), done.stderr.decode())


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
