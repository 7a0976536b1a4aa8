"""The versioned operator API (`/api/v1/...`): the same records as the CLI, read from the
database and local files only, and the scheduler's own controls as actions."""

# No `from __future__ import annotations`: FastAPI reads these signatures at runtime.

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Cookie, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from aiworker.core.context import Environment
from aiworker.core.scheduler_state import PAUSE_REASON_MAX
from aiworker.errors import InvalidInput
from aiworker.web.forge_calls import ForgeCalls
from aiworker.web.protection import CSRF_COOKIE, CsrfTokens
from aiworker.web.task_api import TaskId, add_task_routes

LOG_TAIL_MAX = 64 * 1024


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SettingsChange(Strict):
    revision: Annotated[str, Field(min_length=1, max_length=128)]
    values: dict[Annotated[str, Field(max_length=200)], Any]


class AccessRepair(Strict):
    revision: Annotated[str, Field(min_length=1, max_length=128)]
    # The owner's or an admin's token, for this call only: never stored, masked if said.
    admin_token: Annotated[str, Field(min_length=8, max_length=512, pattern=r"^[\x21-\x7e]+$")]
    repositories: Annotated[list[Annotated[int, Field(ge=1)]], Field(max_length=1000)] | None = None


class PauseRequest(Strict):
    reason: Annotated[str, Field(max_length=PAUSE_REASON_MAX)] = ""


class StopSlotRequest(Strict):
    slot: Annotated[int, Field(ge=1, le=3)]
    confirm: StrictBool  # "yes" or 1 is not a confirmation


class Session(BaseModel):
    csrf_token: str


class ErrorBody(BaseModel):
    code: str
    message: str
    details: list[str] | None = None


class ErrorDocument(BaseModel):
    """The CLI's error shape, which every refusal uses."""

    error: ErrorBody


def _refusal(why: str) -> dict[str, Any]:
    return {"model": ErrorDocument, "description": why}


REFUSALS: dict[int | str, dict[str, Any]] = {
    400: _refusal("invalid input, named"),
    403: _refusal("a change without a permitted Origin or the CSRF token"),
    404: _refusal("what the path names does not exist (a task id)"),
    409: _refusal("a conflict: a stale revision, an idle slot"),
    413: _refusal("the body is too large"),
    421: _refusal("the Host is not this server's address"),
    503: _refusal("something this needs is unavailable now"),
}


def build_router(environment: Callable[[], Environment], tokens: CsrfTokens) -> APIRouter:
    """The API over ENVIRONMENT, which is read afresh for every request (a saved setting
    shows at once)."""
    router = APIRouter(prefix="/api/v1", responses=REFUSALS)
    Env = Annotated[Environment, Depends(environment)]
    forge = ForgeCalls()

    @router.get("/session", response_model=Session)
    def session(
        response: Response,
        current: Annotated[str | None, Cookie(alias=CSRF_COOKIE, max_length=200)] = None,
    ) -> dict[str, str]:
        # A second tab gets the token the first one holds, so neither is locked out; a
        # cookie this server did not issue is replaced.
        token = current if current is not None and tokens.valid(current) else tokens.issue()
        response.set_cookie(
            CSRF_COOKIE, token, httponly=True, samesite="strict", path="/", secure=False
        )
        response.headers["cache-control"] = "no-store"
        return {"csrf_token": token}

    @router.get("/status")
    def status(env: Env) -> dict[str, Any]:
        from aiworker.core.scheduler_state import SchedulerState
        from aiworker.core.scheduling.overview import collect_status

        state = SchedulerState.load(env.state_dir)
        return {
            **collect_status(env).to_json(),
            "paused": state.paused,
            "paused_reason": state.paused_reason,
            "next_check": state.next_deadline,
            "check_requested": state.check_requested,
        }

    add_task_routes(router, Env)

    @router.get("/tasks/{task_id}/logs")
    def logs(
        env: Env, task_id: TaskId, limit: Annotated[int, Query(ge=1, le=LOG_TAIL_MAX)] = 8192
    ) -> dict[str, Any]:
        from aiworker.core.tasks.inspect import task_log_tail

        size, tail = task_log_tail(env, task_id, limit)
        return {"task": task_id, "bytes": size, "tail": tail}

    @router.get("/providers")
    def providers(env: Env) -> dict[str, Any]:
        from aiworker.core.providers.readings import stored_readings

        return stored_readings(env).to_json()

    @router.get("/events")
    def events(
        env: Env,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        before: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    ) -> dict[str, Any]:
        from aiworker.core.tasks.inspect import recent

        return recent(env, limit, before)

    _changes(router, Env, forge)
    return router


def _changes(router: APIRouter, Env: Any, forge: ForgeCalls) -> None:
    """Settings and the scheduler's controls."""

    @router.get("/settings")
    def settings(env: Env) -> dict[str, Any]:
        from aiworker.core.maintenance.settings import read_settings

        return read_settings(env.loaded).to_json()

    @router.put("/settings")
    def save(env: Env, change: SettingsChange) -> dict[str, Any]:
        from aiworker.core.maintenance.settings import added_repositories, save_settings

        added = added_repositories(env.loaded, change.values)
        revision = save_settings(env.loaded, change.revision, change.values)
        return {"revision": revision, "added_repositories": added}

    @router.post("/access/check")
    async def check_access(env: Env) -> dict[str, Any]:
        from aiworker.core.maintenance.access import check_access as check

        return (await forge.run(check, env)).to_json()

    @router.post("/access/repair")
    async def repair_access(env: Env, request: AccessRepair) -> dict[str, Any]:
        from aiworker.core.maintenance.access import repair_access as repair

        asked = (env, request.revision, request.admin_token, request.repositories)
        return (await forge.run(repair, *asked)).to_json()

    @router.get("/capabilities")
    def capabilities() -> dict[str, Any]:
        from aiworker.core.maintenance.settings import capabilities as read

        return read().to_json()

    @router.post("/actions/start-now")
    def start_now(env: Env) -> dict[str, Any]:
        from aiworker.core.scheduling.launcher import request_follow_up

        return request_follow_up(env).to_json()

    @router.post("/actions/pause")
    def pause(env: Env, request: Annotated[PauseRequest | None, Body()] = None) -> dict[str, Any]:
        from aiworker.core.scheduler_state import pause as pause_scheduler

        reason = request.reason if request is not None else ""
        paused = pause_scheduler(env, reason, "the web control plane")
        # Already paused: the first pause stands (its reason, who and since when).
        return {
            "paused": True,
            "reason": paused.reason,
            "already": paused.already,
            "paused_by": paused.paused_by,
            "pending": paused.pending,
        }

    @router.post("/actions/resume")
    def resume(env: Env) -> dict[str, Any]:
        from aiworker.core.scheduler_state import resume as resume_scheduler

        resume_scheduler(env)
        return {"paused": False}

    @router.post("/actions/stop-slot")
    def stop_slot(env: Env, request: StopSlotRequest) -> dict[str, Any]:
        if not request.confirm:
            raise InvalidInput("stopping a slot's job needs confirm: true")
        if request.slot > env.loaded.config.shares:
            raise InvalidInput(f"slot must be between 1 and shares ({env.loaded.config.shares})")
        from aiworker.core.scheduling.controls import stop_slot_job

        return stop_slot_job(env, request.slot, "the web control plane")
