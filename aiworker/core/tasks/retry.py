"""`aiworker task retry`: an operator gives a failed or needs_input task another go, or
starts a paused one over.

Its budgets are reset, recording what had been used. A step past implementation that
failed because its own budget was spent (publish, CI, review, merge, the plan's step)
is retried where it failed, its work kept, as after a pause: the step re-verifies what
it relies on, and nothing is implemented again. A task whose repair budget ran out gets
the repair episode it was refused, from where the last one left off. Anything else (a
failure the work decided, an implemented head this controller no longer holds), or a
retry asked to start over, goes back to ready.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.phases.table import REPAIR, TASK, starting
from aiworker.core.report import Report
from aiworker.core.tasks.lifecycle import advance
from aiworker.core.tasks.repairs import REQUESTED
from aiworker.core.tasks.states import TaskState
from aiworker.errors import Conflict
from aiworker.runtime.git_failures import GitCacheError
from aiworker.runtime.gitcache import GitCache
from aiworker.store.budgets import reset
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task
from aiworker.store.task_records import existing_task, failure
from aiworker.store.tasks import append_event

RETRYABLE = (TaskState.FAILED, TaskState.NEEDS_INPUT)


@dataclass
class RetryReport(Report):
    task: int
    state: str
    budget_reset: dict[str, int]


def retry_task(env: Environment, task_id: int, *, from_start: bool = False) -> RetryReport:
    """Retry TASK_ID with its budgets reset: where it failed, or (FROM_START) from ready."""
    db = env.open_database()
    try:
        with db.read() as session:
            task = existing_task(session, task_id)
        # A paused task may start over (one held because what its work was built on is
        # gone); where it was paused is `task resume`'s.
        if task.state not in RETRYABLE and not (from_start and task.state == TaskState.PAUSED):
            raise Conflict(
                f"task {task_id} is {task.state}; only failed or needs_input tasks are retried"
                " (a paused one from the start)"
            )
        resumed, request = (None, None) if from_start else _where_it_failed(env, db, task)
        to_state = resumed or TaskState.READY
        with db.write() as session:
            before = reset(session, task.id)
            advance(
                session,
                task.id,
                task.state,
                task.version,
                to_state,
                "retried by an operator; budgets reset",
                actor="operator",
                kind="task.retried",
                data={"budget_reset": before},
            )
            if request is not None:  # the episode the repair budget did not allow
                append_event(session, REQUESTED, task_id=task.id, actor="operator", data=request)
        return RetryReport(task.id, to_state, before)
    finally:
        db.dispose()


def _where_it_failed(
    env: Environment, db: Database, task: Task
) -> tuple[TaskState | None, dict[str, Any] | None]:
    """Where the task failed because a budget ran out, if its work is still at hand: the
    step's state, or repairing with the repair the budget did not allow (its request);
    (None, None): from ready."""
    if task.state != TaskState.FAILED:
        return None, None
    with db.read() as session:
        failed = failure(session, task.id)
        repo = session.get(Repository, task.repository_id)
    if failed is None or repo is None or "used" not in failed[1]:
        return None, None  # not a spent budget: an end the work decided
    where, data = failed
    if data.get("phase") == REPAIR.name and "cause" in data:
        request = {k: v for k, v in data.items() if k not in ("phase", "used", "limit")}
        return TaskState.REPAIRING, request
    step = starting(TASK, task.kind, where)
    if step is None or data.get("phase") != step.name:
        return None, None
    if where == TaskState.IMPLEMENTED and not _held(env, repo, task):
        return None, None
    return TaskState(where), None


def _held(env: Environment, repo: Repository, task: Task) -> bool:
    """The implemented head is still in this controller's git cache, to be published."""
    if task.head_commit is None:
        return False
    try:
        GitCache(env.state_dir).resolve(repo.index, task.head_commit)
    except GitCacheError:
        return False
    return True
