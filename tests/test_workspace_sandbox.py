"""The local backend runs providers inside bubblewrap when it is installed."""

from __future__ import annotations

import os
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


def test_other_providers_homes_are_hidden(tmp_path):
    """File modes do not separate jobs of one user: the other homes are not there."""
    workspace = Workspace(tmp_path / "ws")
    workspace.repo.mkdir(parents=True)
    providers = tmp_path / "providers"
    (providers / "claude").mkdir(parents=True, mode=0o700)
    (providers / "claude" / ".credentials.json").write_text("secret")
    own = providers / "codex"
    own.mkdir(mode=0o700)
    (own / "auth.json").write_text("mine")
    script = f"ls {providers}; cat {own}/auth.json; echo; cat {providers}/claude/.credentials.json"
    argv = sandboxed(["/bin/sh", "-c", script], workspace, [own], hidden=[providers])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.split() == ["codex", "mine"]
    assert "No such file" in done.stderr
    assert (providers / "claude" / ".credentials.json").read_text() == "secret"


@pytest.mark.skipif(os.geteuid() != 0, reason="the user namespace is for root-started jobs")
def test_a_root_started_job_is_an_ordinary_user_whose_files_stay_the_hosts(tmp_path):
    workspace = Workspace(tmp_path / "ws")
    workspace.repo.mkdir(parents=True)
    script = "id -u; grep CapEff /proc/self/status; touch made; git init -q . && git status -s"
    argv = sandboxed(["/bin/sh", "-c", script], workspace, [])
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, cwd=workspace.repo
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0] == "1000"
    assert lines[1].split() == ["CapEff:", "0000000000000000"]
    assert (workspace.repo / "made").stat().st_uid == 0
