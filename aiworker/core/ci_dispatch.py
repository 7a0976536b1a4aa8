"""`aiworker ci --task ID`: run the repository's ./ci/run at the PR head and report it.

The controller posts `pending`, runs the check through the runner core on a
fresh checkout of the exact head, writes a receipt, and posts the terminal
status under the context `aiworker / ci`.
"""

from __future__ import annotations

from typing import Any

from aiworker.core.delivery import CI_CONTEXT, load_delivery, move, pull_at_head
from aiworker.core.environment import Environment
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.quality_gate import Requirement, run_checks
from aiworker.runtime.gitcache import GitCache


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
        }
    finally:
        db.dispose()
