"""`aiworker ci --task ID`: run the repository's ./ci/run at the PR head and report it.

The controller posts `pending`, runs the check through the runner core on a
fresh checkout of the exact head, writes a receipt, and posts the terminal
status under the context `aiworker / ci`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.delivery.pull import CI_CONTEXT, load_delivery, move, pull_at_head
from aiworker.core.evidence.gate import Requirement, run_checks
from aiworker.core.forge_access import ForgeAccess
from aiworker.runtime.atomic import write_private_file
from aiworker.runtime.gitcache import GitCache


def write_evidence(env: Environment, task_id: int, head: str, check: dict[str, Any]) -> Path:
    """The run's evidence as a private JSON file the status links to (until the web plane
    serves receipts)."""
    folder = env.state_dir / "evidence"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"task-{task_id}-ci-{head}.json"
    write_private_file(
        path, json.dumps({"task": task_id, "head": head, **check}, indent=2).encode()
    )
    return path


def dispatch_ci(env: Environment, task_id: int) -> dict[str, Any]:
    db = env.open_database()
    try:
        delivery = load_delivery(db, task_id, "awaiting_ci")
        task, repo = delivery.task, delivery.repo
        assert task.head_commit is not None
        assert task.base_commit is not None
        access = ForgeAccess(env.loaded)
        worker = access.required("worker")
        pull_at_head(worker, delivery)
        worker.create_status(
            repo.owner,
            repo.name,
            task.head_commit,
            state="pending",
            context=CI_CONTEXT,
            description="./ci/run is running",
        )
        report = run_checks(
            db,
            GitCache(env.state_dir),
            index=repo.index,
            head=task.head_commit,
            base=task.base_commit,
            task_id=task.id,
            scope=task.scope_fingerprint,
            requirements=[Requirement("ci", ("./ci/run",))],
            phase="ci",
        )
        check = report.checks[0]
        state = "success" if report.passed else "failure"
        evidence = write_evidence(env, task.id, task.head_commit, check)
        description = (
            f"./ci/run {check['status']} (exit {check['exit_code']}) at "
            f"{task.head_commit[:12]}; stdout sha256 {check['stdout_sha256'][:16]}"
        )
        worker.create_status(
            repo.owner,
            repo.name,
            task.head_commit,
            state=state,
            context=CI_CONTEXT,
            description=description[:140],
            target_url=evidence.as_uri(),
        )
        move(
            db,
            task,
            "awaiting_ci",
            "awaiting_review" if report.passed else "failed",
            "ci.finished",
            {"state": state, "head": task.head_commit, "pr": delivery.pr},
        )
        return {
            "task": task.id,
            "pr": delivery.pr,
            "head": task.head_commit,
            "state": state,
            "check": check,
            "evidence": str(evidence),
        }
    finally:
        db.dispose()
