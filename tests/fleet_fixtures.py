"""Helpers for the runner fleet tests: a repository committed with real git, its snapshot
published and a job queued as the controller does, and the controller's runner listener
(`web serve --runner-listen`) as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from aiworker.core.runner.snapshots import publish
from aiworker.store.worker_jobs import enqueue
from tests.forge_fixtures import git

TOKEN = "runner-token-7d2f9a61c0e4a1b2c3d4e5f60718293a"


def commit_tree(repo: Path, files: dict, links: dict | None = None) -> str:
    """Commit FILES (path -> text or bytes; ci/* executable) and LINKS; the root tree id."""
    git("init", "-q", str(repo))
    for path, content in files.items():
        target = repo / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
        if path.startswith("ci/"):
            target.chmod(0o755)
    for path, to in (links or {}).items():
        (repo / path).symlink_to(to)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree", cwd=repo)
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD^{tree}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def queue_job(db, state_dir: Path, repo: Path, index: int, argv=("./ci/run",), **more) -> int:
    """Publish REPO's HEAD for repository INDEX and queue a job running ARGV on it."""
    snapshot = publish(state_dir, repo, index, "HEAD")
    request = {
        "contract": "ait.runner.native-job.v3",
        "label": more.pop("label", "ci"),
        "source": {
            "kind": "remote_snapshot",
            "repository_index": more.pop("source_index", index),
            "repository_name": f"team/repo-{index}",
            "snapshot_id": snapshot,
            "external": more.pop("external", {}),
        },
        "command": {"argv": list(argv), "environment": more.pop("environment", {})},
        "timeout_ms": more.pop("timeout_ms", 60_000),
        "suite_id": more.pop("suite_id", "ci"),
    }
    return enqueue(db, index, request)


def write_config(tmp_path: Path, *, lease_seconds: int = 30, extra: str = "") -> Path:
    token_file = tmp_path / "runner.token"
    token_file.write_text(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    config = tmp_path / "config.toml"
    config.write_text(
        f"[runners]\nlease_seconds = {lease_seconds}\n"
        f'tokens = [{{token_file = "{token_file}"}}]\n{extra}'
    )
    return config


class Listener(NamedTuple):
    process: subprocess.Popen
    url: str  # the runner API
    operator: str  # the operator API, on loopback


@contextmanager
def runner_listener(listen: str = "127.0.0.1:0", env: dict | None = None, prefix=()):
    """`aiworker web serve --runner-listen LISTEN`; yields its Listener."""
    argv = [*prefix, sys.executable, "-m", "aiworker", "web", "serve"]
    argv += ["--listen", "127.0.0.1:0", "--runner-listen", listen]
    if not listen.startswith("127."):
        argv.append("--allow-remote")
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        operator = process.stdout.readline().split(" at ", 1)[1].strip().rstrip("/")
        line = process.stdout.readline()
        assert line.startswith("aiworker runner API at "), line
        yield Listener(process, line.split(" at ", 1)[1].strip().rstrip("/"), operator)
    finally:
        stop(process, timeout=30)
        process.stdout.close()


def stop(process: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM, as systemd stops a unit; SIGKILL if it has not ended within TIMEOUT."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def runner_argv(*args: str, prefix=()) -> list[str]:
    return [*prefix, sys.executable, "-m", "aiworker", "--json", "runner", *args]


def runner_env() -> dict:
    return {**os.environ, "AIWORKER_SERVER_TOKEN": TOKEN}
