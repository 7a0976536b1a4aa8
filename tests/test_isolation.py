"""Isolation fails closed: a real agent never runs on this host by accident, and where the
local backend is chosen, the agent cannot read the tokens, the configuration or the
database (a script provider that tries shows it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

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
    # The logins of other programs in the home of the user aiworker runs as (outside
    # the configuration's folder, which is hidden as a whole).
    home = tmp_path.parent / f"{tmp_path.name}-home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text(CANARY)
    (home / ".git-credentials").write_text(f"https://u:{CANARY}@forge.example\n")
    # Another repository's check in the embedded runner's attempts.
    temp = tmp_path.parent / f"{tmp_path.name}-tmp"
    other = temp / "aiworker" / "attempts" / "attempt-other" / "notes.txt"
    other.parent.mkdir(parents=True)
    other.write_text(CANARY)
    probed = [
        str(token),
        str(config),
        str(tmp_path / "operator-notes.txt"),
        str(upgraded),  # the database
        str(state_dir),
        str(home / ".ssh" / "id_ed25519"),
        str(home / ".git-credentials"),
        str(other),
        "/etc/hostname",  # an ordinary file: readable, so the probe itself works
    ]
    task = claimed(
        SCRIPT_ONLY + '[execution]\nbackend = "local"\n',
        edits={"calc.py": FIX},
        probe=probed,
        result=result_doc(),
    )
    moved = {"HOME": str(home), "TMPDIR": str(temp)}
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1", env=moved)
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
    assert seen[str(home / ".git-credentials")] == "read: "
    assert forge.tokens["worker-bot"] not in shown.stdout
    assert CANARY not in shown.stdout
    assert "[forge]" not in shown.stdout
    assert "SQLite format 3" not in shown.stdout
    hidden = (config, tmp_path / "operator-notes.txt", upgraded, home / ".ssh" / "id_ed25519")
    for path in (*map(str, hidden), str(other)):
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
    # Claimed again and run by hand: the summary names no provider and no attempt.
    assert run_process("--json", "claim", "--slot", "1", env=env).json()["task"] == task
    by_hand = run_process("implement", "--task", str(task), "--slot", "1", env=env)
    assert by_hand.exit_code == 75, by_hand
    assert by_hand.stdout.splitlines()[0] == f"task {task}: unavailable"
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


# The repository's checks are code the agent wrote: this ./ci/run reports what it can
# read and where it can write, then runs the tests.
CHECK_PROBE = """#!/bin/sh
set -eu
cd "$(dirname "$0")/.."
python3 - <<'PROBE'
import json, os
seen = {}
for path in json.loads(os.environ.get("PROBED", "[]")) or %s:
    try:
        if os.path.isdir(path):
            seen[path] = "directory: " + ",".join(sorted(os.listdir(path)))
        else:
            seen[path] = "read: " + open(path, errors="replace").read(200)
    except OSError as exc:
        seen[path] = "refused: " + exc.strerror
try:
    open("%s", "w").write("escaped")
    seen["write"] = "written"
except OSError as exc:
    seen["write"] = "refused: " + exc.strerror
print("PROBE " + json.dumps(seen))
PROBE
python3 -m unittest -q
"""


def test_checks_on_this_host_cannot_read_the_secrets_or_other_attempts(
    forge, claimed, upgraded, tmp_path
):
    config = tmp_path / "config.toml"
    token = _worker_token_in_a_file(config, forge, tmp_path)
    escape = tmp_path.parent / f"{tmp_path.name}-escape"
    # Another job's attempt beside this one's, under the same attempt root.
    temp = tmp_path.parent / f"{tmp_path.name}-tmp"
    root = temp / "aiworker" / "attempts"
    (root / "attempt-other").mkdir(parents=True)
    (root / "attempt-other" / "notes.txt").write_text(CANARY)
    probed = [str(token), str(config), str(upgraded), str(root), "/etc/hostname", "/run"]
    probed.append(str(root / "attempt-other" / "notes.txt"))
    task = claimed(
        SCRIPT_ONLY + '[execution]\nbackend = "local"\n',
        edits={"calc.py": FIX, "ci/run.sh": CHECK_PROBE % (json.dumps(probed), escape)},
        result=result_doc(),
    )
    assert run_process("--json", "implement", "--task", str(task), "--slot", "1").exit_code == 0
    assert run_process("--json", "publish", "--task", str(task)).exit_code == 0
    checked = run_process("--json", "ci", "--task", str(task), env={"TMPDIR": str(temp)})
    assert checked.exit_code == 0, checked
    evidence = json.loads(Path(checked.json()["evidence"]).read_text())
    [line] = [x for x in evidence["stdout_tail"].splitlines() if x.startswith("PROBE ")]
    seen = json.loads(line.removeprefix("PROBE "))
    assert seen["/etc/hostname"].startswith("read: ")
    assert len(seen["/etc/hostname"]) > 6  # the probe does read what is not hidden
    assert seen[str(token)] == "read: "  # an empty file in its place
    for path in (str(config), str(upgraded), str(root / "attempt-other" / "notes.txt")):
        assert seen[path] == "refused: No such file or directory", (path, seen[path])
    # The attempt root shows the check's own attempt only.
    [own] = seen[str(root)].removeprefix("directory: ").split(",")
    assert own.startswith("attempt-")
    assert own != "attempt-other"
    assert seen["write"] == "refused: Read-only file system"
    assert not escape.exists()
    # No service socket under /run (the user's systemd, D-Bus, the journal) to ask for
    # help outside the jail: only the resolver's files, when the host has them.
    shown = seen["/run"].removeprefix("directory: ")
    assert set(filter(None, shown.split(","))) <= {"systemd", "resolvconf"}, seen["/run"]
    assert forge.tokens["worker-bot"] not in json.dumps(evidence)
    assert CANARY not in json.dumps(evidence)
    assert (root / "attempt-other" / "notes.txt").read_text() == CANARY
    assert query(upgraded, "select state from tasks") == [("awaiting_review",)]


def test_a_sqlite_store_kept_outside_the_state_directory_is_hidden_from_jobs(tmp_path):
    from aiworker.config.loader import load_config
    from aiworker.core.context import Environment
    from aiworker.core.guests.backends import host_secrets

    database = tmp_path / "data" / "aiworker.db"
    config = tmp_path / "etc" / "config.toml"
    config.parent.mkdir()
    config.write_text(f'[database]\nurl = "sqlite:///{database}"\n')
    env = Environment(tmp_path / "state", load_config(config, required=True))
    hidden = host_secrets(env)
    for end in ("", "-wal", "-shm"):
        assert Path(f"{database}{end}") in hidden, hidden


def test_a_runner_token_file_anywhere_is_hidden_from_jobs_like_the_forge_s(tmp_path):
    """A runner token kept outside the configuration's folder (runners.tokens) was readable
    by checks and local agents, which could print it in a form masking misses (base64) or
    use it to claim jobs: every token file the configuration names is hidden."""
    from aiworker.config.loader import load_config
    from aiworker.core.context import Environment
    from aiworker.core.guests.backends import host_secrets

    token = tmp_path / "secrets" / "runner.token"
    config = tmp_path / "etc" / "config.toml"
    config.parent.mkdir()
    config.write_text(f'[runners]\ntokens = [{{token_file = "{token}"}}]\n')
    env = Environment(tmp_path / "state", load_config(config, required=True))
    assert token in host_secrets(env)
