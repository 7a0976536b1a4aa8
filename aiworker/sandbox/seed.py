"""Seeding the sandbox forge: users, a small project with a failing test, and issues."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from aiworker.runtime.processes import run_command
from aiworker.sandbox.gitrepo import SANDBOX_IDENTITY, BareRepo, GitFailed
from aiworker.sandbox.state import ForgeState

USERS = (
    ("admin", "site admin", True),
    ("team", "repository owner", False),
    ("planner-bot", "planner identity", False),
    ("worker-bot", "worker identity", False),
    ("reviewer-bot", "reviewer identity", False),
    ("ci-bot", "ci status identity", False),
    ("alice", "human writer", False),
    ("reader", "read-only user", False),
)
COLLABORATORS = {
    "planner-bot": "write",
    "worker-bot": "write",
    "reviewer-bot": "write",
    "ci-bot": "write",
    "alice": "write",
    "reader": "read",
}
PROJECT = {
    "README.md": "# app\n\nA tiny calculator used by the aiworker demo.\n",
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": (
        "import unittest\n\nfrom calc import add\n\n\n"
        "class AddTest(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n\n"
        "if __name__ == '__main__':\n    unittest.main()\n"
    ),
    "ci/run.sh": '#!/bin/sh\nset -eu\ncd "$(dirname "$0")/.."\npython3 -m unittest -v\n',
}
LABELS = (
    ("aiworker", "0e8a16"),
    ("aiworker-plan", "1d76db"),
    ("aiworker-approved", "5319e7"),
    ("bug", "d73a4a"),
)


def seed(data_dir: Path) -> dict[str, Any]:
    state = ForgeState(data_dir)
    users = [
        {"login": login, "role": role, "token": state.add_user(login, admin=admin)["token"]}
        for login, role, admin in USERS
    ]
    repo = state.repo("team", "app")
    if repo is None:
        repo = state.add_repo("team", "app")
        repo["collaborators"].update(COLLABORATORS)
        for name, color in LABELS:
            repo["labels"].append(
                {"id": state.new_id(), "name": name, "color": color, "description": ""}
            )
        create_project(BareRepo(data_dir / "git" / "team" / "app.git"), PROJECT)
        issue = state.add_issue(
            repo,
            "alice",
            "add() returns the wrong result",
            "`add(2, 3)` returns -1; it must return 5.\n\nThe failing test is `test_calc.py`.",
        )
        issue["assignees"] = ["worker-bot"]
        state.record(issue, "assignees", "alice", assignee="worker-bot")
        state.add_issue(repo, "reader", "Please add subtraction", "Nice to have.")
        state.save()
    return {
        "users": users,
        "repositories": [
            {
                "full_name": "team/app",
                "default_branch": repo["default_branch"],
                "issues": [i["number"] for i in repo["issues"]],
            }
        ],
    }


def create_project(bare: BareRepo, files: dict[str, str], branch: str = "main") -> str:
    """Create BARE with one commit holding FILES; return the commit's hash."""
    bare.init(branch)
    work = Path(tempfile.mkdtemp(prefix="sandbox-seed-"))
    try:
        for name, text in files.items():
            path = work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if name.endswith(".sh"):
                path.chmod(0o755)
        env = bare.env(SANDBOX_IDENTITY)
        for args in (
            ["init", "-q", "-b", branch],
            ["add", "-A"],
            ["commit", "-q", "-m", "Initial project"],
            ["push", "-q", str(bare.path), f"HEAD:refs/heads/{branch}"],
        ):
            result = run_command(["git", "-C", str(work), *args], env=env, timeout=60)
            if not result.ok:
                raise GitFailed(result.stderr.strip())
        return bare.must("rev-parse", f"refs/heads/{branch}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
