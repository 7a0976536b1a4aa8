"""Git on the host reads a job's workspace after the job, which could write there: no
configuration the job wrote (a .gitconfig beside the checkout, the checkout's own
.git/config and .gitattributes) makes git on the host run a program of the job's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from aiworker.runtime.workspace import (
    Workspace,
    WorkspaceError,
    altered,
    changed_lines,
    prepare_workspace,
    result_bundle,
)


def git(cwd: Path, *args: str) -> None:
    identity = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "core.fsmonitor=false"]
    subprocess.run(["git", *identity, *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    source.mkdir()
    git(source, "init", "-q", "-b", "main")
    (source / "a.txt").write_text("a\n")
    # The repository's own attributes name a filter and a diff driver that nothing defines.
    (source / ".gitattributes").write_text("* filter=x diff=x\n")
    git(source, "add", ".")
    git(source, "commit", "-qm", "one")
    git(source, "bundle", "create", "-q", str(tmp_path / "base.bundle"), "main")
    return tmp_path / "base.bundle"


def plant(workspace: Workspace, config: Path, ran: Path) -> None:
    """What a hostile job writes: a program, and every setting that names it."""
    program = workspace.root / "payload.sh"
    program.write_text(f'#!/bin/sh\necho ran "$@" >> {ran}\nexit 1\n')
    program.chmod(0o755)
    with config.open("a") as handle:
        handle.write(
            f"[core]\n\tfsmonitor = {program}\n\thooksPath = {workspace.root}\n"
            f'[filter "x"]\n\tclean = {program}\n\tprocess = {program}\n'
            f'[diff]\n\texternal = {program}\n[diff "x"]\n\ttextconv = {program}\n'
        )
    for hook in ("post-checkout", "reference-transaction", "pre-auto-gc"):
        (workspace.root / hook).symlink_to(program)


def test_git_on_the_host_runs_nothing_a_job_configured_beside_its_checkout(tmp_path, bundle):
    """A read-only phase (review, plan) cannot write its checkout, but can write the
    workspace around it: after it, the host checks what changed."""
    workspace = prepare_workspace(tmp_path / "ws", bundle, "refs/heads/main", {"p.md": "x"})
    ran = tmp_path / "ran"
    plant(workspace, workspace.root / ".gitconfig", ran)
    assert altered(workspace) == []
    (workspace.repo / "a.txt").write_text("changed\n")  # status compares its contents
    (workspace.repo / "new file ä.txt").write_text("new\n")
    git(workspace.repo, "commit", "-qm", "moved", "--allow-empty")
    found = altered(workspace)
    assert found[0].startswith("HEAD moved to")
    assert sorted(found[1:]) == ["a.txt", "new file ä.txt"]
    assert not ran.exists(), ran.read_text()


def test_git_on_the_host_runs_nothing_a_job_configured_in_its_checkout(tmp_path, bundle):
    """A phase that commits (implement, repair) owns its checkout's .git/config: the host
    then counts the changed lines and bundles the commits."""
    workspace = prepare_workspace(tmp_path / "ws", bundle, "refs/heads/main", {"p.md": "x"})
    (workspace.repo / "a.txt").write_text("changed\n")
    git(workspace.repo, "commit", "-qam", "the job's work")
    ran = tmp_path / "ran"
    plant(workspace, workspace.repo / ".git" / "config", ran)
    assert changed_lines(workspace) == 2
    assert result_bundle(workspace, tmp_path / "result.bundle") is not None
    assert not ran.exists(), ran.read_text()


def test_the_work_goes_out_with_the_checkouts_own_objects_only(tmp_path, bundle):
    """A job owns its .git in a phase that commits: alternates pointing at another
    repository on this host would put that one's objects into the work's bundle."""
    workspace = prepare_workspace(tmp_path / "ws", bundle, "refs/heads/main", {"p.md": "x"})
    (workspace.repo / "a.txt").write_text("changed\n")
    git(workspace.repo, "commit", "-qam", "the job's work")
    alternates = workspace.repo / ".git" / "objects" / "info" / "alternates"
    alternates.parent.mkdir(parents=True, exist_ok=True)
    alternates.write_text(str(tmp_path / "source" / ".git" / "objects") + "\n")
    assert result_bundle(workspace, tmp_path / "result.bundle") is not None
    assert not alternates.exists()
    shutil.rmtree(workspace.repo / ".git")
    (workspace.repo / ".git").write_text(f"gitdir: {tmp_path / 'source' / '.git'}\n")
    with pytest.raises(WorkspaceError, match=r"replaced the checkout's \.git"):
        changed_lines(workspace)
