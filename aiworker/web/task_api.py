"""The operator API's task views with links to the forge, and the per-task actions
(retry, resume, cancel) the page offers; the same rules as every change (Host, Origin, CSRF)."""

# No `from __future__ import annotations`: FastAPI reads these signatures at runtime.

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, StrictBool

from aiworker.core.context import Environment
from aiworker.errors import InvalidInput

# Ids are SQLite integers: anything beyond is refused as input, not failed on.
TaskId = Annotated[int, Path(ge=1, le=2**63 - 1)]


class RetryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    from_start: StrictBool = False  # back to ready, its work made anew


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    confirm: StrictBool  # "yes" or 1 is not a confirmation


def forge_link(env: Environment, repository: str, kind: str, number: int | None) -> str | None:
    """The forge's own page for issue or pull NUMBER of REPOSITORY ("owner/name")."""
    forge = env.loaded.config.forge
    if forge is None or not number or "/" not in repository:
        return None
    return f"{str(forge.url).rstrip('/')}/{repository}/{kind}/{number}"


def add_task_routes(router: APIRouter, Env: Any) -> None:
    @router.get("/tasks")
    def tasks(
        env: Env,
        state: Annotated[str | None, Query(max_length=32)] = None,
        after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
        limit: Annotated[int, Query(ge=1, le=500)] = 100,
    ) -> dict[str, Any]:
        from aiworker.core.tasks.inspect import list_task_rows

        report = list_task_rows(env, state, limit, after).to_json()
        for row in report["tasks"]:
            row["issue_url"] = forge_link(env, row["repository"], "issues", row["issue"])
        return report

    @router.get("/tasks/{task_id}")
    def task(env: Env, task_id: TaskId) -> dict[str, Any]:
        from aiworker.core.tasks.inspect import show_task

        report = show_task(env, task_id).to_json()
        report["issue_url"] = forge_link(env, report["repository"], "issues", report["issue"])
        for publication in report["publications"]:
            publication["pr_url"] = forge_link(
                env, report["repository"], "pulls", publication["pr"]
            )
        return report

    @router.post("/tasks/{task_id}/retry")
    def retry(env: Env, task_id: TaskId, request: RetryRequest | None = None) -> dict[str, Any]:
        from aiworker.core.tasks.retry import retry_task

        from_start = request is not None and request.from_start
        return retry_task(env, task_id, from_start=from_start).to_json()

    @router.post("/tasks/{task_id}/resume")
    def resume(env: Env, task_id: TaskId) -> dict[str, Any]:
        """A paused task (one held for a person: its PR closed, its repository archived,
        a token short of a scope) goes on where it was, as `task resume` does."""
        from aiworker.core.tasks.hold import resume_task

        return resume_task(env, task_id).to_json()

    @router.post("/tasks/{task_id}/cancel")
    def cancel(env: Env, task_id: TaskId, request: CancelRequest) -> dict[str, Any]:
        if not request.confirm:
            raise InvalidInput("cancelling a task needs confirm: true")
        from aiworker.core.tasks.operator import cancel_task

        # Its comment on the task's pull request is tried once: a stalled forge holds a
        # cancel one forge timeout at most, not behind the access checks' threads.
        return cancel_task(env, task_id).to_json()
