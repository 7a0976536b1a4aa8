"""The local backend runs providers inside bubblewrap when it is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from aiworker.runtime.workspace import Workspace, sandboxed

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def test_only_the_workspace_is_writable(tmp_path):
    workspace = Workspace(tmp_path / "ws")
    workspace.repo.mkdir(parents=True)
    escape = Path("/usr/aiworker-sandbox-escape")
    host_only = tmp_path.parent / "aiworker-host-only"
    host_only.write_text("not for the sandbox")
    script = (
        f"touch inside && (touch {escape} 2>/dev/null && echo escaped || echo refused) "
        f"&& (test -e {host_only} && echo visible || echo hidden)"
    )
    argv = sandboxed(["/bin/sh", "-c", script], workspace, [])
    assert argv[0].endswith("bwrap")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    # A read-only system, and a private /tmp holding only what was bound into it.
    assert done.stdout.split() == ["refused", "hidden"]
    assert (workspace.repo / "inside").exists()
    assert not escape.exists()


def test_provider_homes_stay_writable(tmp_path):
    workspace = Workspace(tmp_path / "ws")
    workspace.repo.mkdir(parents=True)
    home = tmp_path / "codex-home"
    home.mkdir()
    argv = sandboxed(["/bin/sh", "-c", f"echo token > {home}/auth.json"], workspace, [home])
    subprocess.run(argv, check=True, timeout=60)
    assert (home / "auth.json").read_text() == "token\n"
