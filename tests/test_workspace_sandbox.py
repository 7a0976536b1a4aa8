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
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace.home / "tmp").mkdir(parents=True)
    script = (
        f"touch inside && (touch {escape} 2>/dev/null && echo escaped || echo refused) "
        f"&& (touch {outside}/x 2>/dev/null && echo escaped || echo refused) "
        '&& touch "$TMPDIR/scratch" && echo tmp-ok'
    )
    argv = sandboxed(["/bin/sh", "-c", script], workspace, [])
    assert argv[0].endswith("bwrap")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    # The system and everything outside the workspace are read-only; TMPDIR is private.
    assert done.stdout.split() == ["refused", "refused", "tmp-ok"]
    assert (workspace.home / "tmp" / "scratch").exists()
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
