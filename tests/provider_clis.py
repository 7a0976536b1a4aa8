"""The real provider CLIs, from the npm registry at the versions the adapters follow,
installed once into .venv/npm-providers (a module fixture; skipped without npm)."""

from __future__ import annotations

import fcntl
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PREFIX = ROOT / ".venv" / "npm-providers"
PACKAGES = ("@openai/codex@0.171.0", "@anthropic-ai/claude-code@2.1.332", "opencode-ai@1.18.33")


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    """Installed once, by one test process at a time: parallel workers wait on a kernel
    lock instead of running npm into the same folder together."""
    PREFIX.mkdir(parents=True, exist_ok=True)
    marker = PREFIX / ".installed"
    with (PREFIX / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists() or marker.read_text() != " ".join(PACKAGES):
            done = subprocess.run(
                ["npm", "install", "--prefix", str(PREFIX), "--no-audit", "--no-fund", *PACKAGES],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0:
                pytest.skip(f"npm could not install the CLIs: {done.stderr.strip()[-300:]}")
            marker.write_text(" ".join(PACKAGES))
    return PREFIX / "node_modules" / ".bin"
