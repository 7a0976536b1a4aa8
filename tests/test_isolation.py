"""Isolation fails closed: a real agent never runs on this host by accident, and where the
local backend is chosen, the agent cannot read the tokens, the configuration or the
database (a script provider that tries shows it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from aiworker.runtime.gitcache import GitCache
from tests.helpers import run_process, worker_token_from_file
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc

CANARY = "canary-token-5f1c0a9e"


def _worker_token_in_a_file(config, forge, tmp_path):
    """The worker identity reads its token from a file (which the agent must not see)."""
    secrets = tmp_path.parent / f"{tmp_path.name}-secrets"  # not beside the configuration
    secrets.mkdir()
    token = secrets / "worker.token"
    token.write_text(forge.tokens["worker-bot"])
    token.chmod(0o600)
    worker_token_from_file(config, token)
    return token


def test_the_local_backend_hides_tokens_configuration_and_state_from_the_agent(
    forge, claimed, upgraded, tmp_path, monkeypatch
):
    config = tmp_path / "config.toml"
    token = _worker_token_in_a_file(config, forge, tmp_path)
    (tmp_path / "operator-notes.txt").write_text(CANARY)  # beside the configuration
    state_dir = upgraded.parent
    probed = [
        str(token),
        str(config),
        str(tmp_path / "operator-notes.txt"),
        str(upgraded),  # the database
        str(state_dir),
        "/etc/hostname",  # an ordinary file: readable, so the probe itself works
    ]
    task = claimed(
        SCRIPT_ONLY + '[execution]\nbackend = "local"\n',
        edits={"calc.py": FIX},
        probe=probed,
        result=result_doc(),
    )
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert result.exit_code == 0, result
    head = result.json()["head"]
    shown = subprocess.run(
        ["git", "--git-dir", str(GitCache(state_dir).path(1)), "show", f"{head}:probe.json"],
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(shown.stdout)
    assert seen["/etc/hostname"].startswith("read: ")
    assert len(seen["/etc/hostname"]) > 6
    assert seen[str(token)] == "read: "  # an empty file in its place
    assert forge.tokens["worker-bot"] not in shown.stdout
    assert CANARY not in shown.stdout
    assert "[forge]" not in shown.stdout
    assert "SQLite format 3" not in shown.stdout
    for path in (str(config), str(tmp_path / "operator-notes.txt"), str(upgraded)):
        assert seen[path] == "refused: No such file or directory", (path, seen[path])
    # The state directory is an empty place with the job's own workspace mounted in it.
    assert seen[str(state_dir)] == "directory: workspaces"
    assert query(upgraded, "select state from tasks") == [("implemented",)]


def test_with_no_image_and_no_backend_chosen_a_real_agent_does_not_run_on_the_host(
    forge, claimed, upgraded, tmp_path
):
    ran = tmp_path / "codex-ran"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A stand-in codex CLI that leaves a mark if it is ever started.
    fake = bin_dir / "codex"
    fake.write_text(f"#!/bin/sh\ntouch {ran}\necho '{{}}'\n")
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    task = claimed('\nproviders = ["codex"]\n', edits={"calc.py": FIX}, result=result_doc())
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1", env=env)
    assert result.exit_code == 75, result
    report = result.json()
    assert (report["outcome"], report["state"]) == ("unavailable", "ready")
    [decision] = report["decisions"]
    assert decision["eligible"] is False
    assert "codex would run on this host (no guest image is provisioned" in decision["reason"]
    assert 'set execution.backend = "local"' in decision["reason"]
    assert not ran.exists()
    assert query(upgraded, "select count(*) from attempts") == [(0,)]
    doctor = run_process("--json", "doctor", env=env).json()
    [execution] = [c for c in doctor["checks"] if c["name"] == "execution"]
    assert execution["status"] == "fail"
    assert "aiworker qemu provision" in execution["detail"]
    status = run_process("--json", "status", env=env).json()
    assert status["isolation"] == {"codex": decision["reason"]}
    shown = run_process("status", env=env).stdout
    assert "Provider codex cannot run: codex would run on this host" in " ".join(shown.split())


def test_the_local_backend_without_bubblewrap_refuses_real_agents_unless_told_it_is_unsafe(
    forge, claimed, upgraded, tmp_path
):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("git", "sh", "python3"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    env = {"PATH": str(bin_dir)}  # no bwrap on it
    config = tmp_path / "config.toml"
    config.write_text(
        'providers = ["codex"]\n[execution]\nbackend = "local"\n' + config.read_text()
    )
    doctor = run_process("--json", "doctor", env=env).json()
    [execution] = [c for c in doctor["checks"] if c["name"] == "execution"]
    assert execution["status"] == "fail"
    assert "without bubblewrap" in execution["detail"]
    assert "execution.local_unsandboxed = true (unsafe" in execution["detail"]
    config.write_text(
        config.read_text().replace("[execution]\n", "[execution]\nlocal_unsandboxed = true\n")
    )
    doctor = run_process("--json", "doctor", env=env).json()
    [execution] = [c for c in doctor["checks"] if c["name"] == "execution"]
    assert execution["status"] == "ok", execution
