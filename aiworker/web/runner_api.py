"""The runner API (`/api/runner/v1/...`) on its own listener (`web serve --runner-listen`),
which may face other hosts: bearer tokens only (no cookies, so no CSRF), bounded bodies,
and no operator route. Errors use the CLI's error shape; a stale lease is 409."""

# No `from __future__ import annotations`: FastAPI reads these signatures at runtime.
import asyncio
import time
from collections.abc import Callable
from typing import Annotated, Any

import anyio
from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from aiworker.core.context import Environment
from aiworker.errors import AiworkerError, Unavailable
from aiworker.runtime.failpoints import failpoint
from aiworker.store.worker_jobs import LeaseLost
from aiworker.web.errors import SERVER_STATE, api_app, error_response
from aiworker.web.protection import Protection

Index = Annotated[int, Path(ge=1, le=2**63 - 1)]


def _job_pair(repository_index: Index, worker_job_index: Index) -> tuple[int, int]:
    """The worker job a route's path names: (its repository's index, its own)."""
    return (repository_index, worker_job_index)


JobPair = Annotated[tuple[int, int], Depends(_job_pair)]

POLL_STEP_S = 0.02  # a waiting claim looks again this often (a read; it claims when it sees one)
MAX_BODY = 1024 * 1024
MAX_WAITING = 32  # waiting claims at once; more wait for a place, not for a thread
Text = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Pair(Strict):
    repository_index: Annotated[int, Field(ge=1, le=2**63 - 1)]
    worker_job_index: Annotated[int, Field(ge=1, le=2**63 - 1)]


class ClaimRequest(Strict):
    worker_id: Text
    request_key: Text  # the same key after a lost reply gets the same lease
    repository_indexes: (
        Annotated[list[Annotated[int, Field(ge=1, le=2**63 - 1)]], Field(max_length=1000)] | None
    ) = None
    exact: Pair | None = None
    wait_ms: Annotated[int, Field(ge=0, le=30_000)] = 0
    repeat_only: bool = False  # only the lease this key already has (a stopping runner)


class LeaseProof(Strict):
    lease_token: Annotated[str, Field(min_length=1, max_length=64)]


class Completion(LeaseProof):
    result: dict[str, Any]  # ait.runner.native-result.v1, checked by the controller


class Failure(LeaseProof):
    error: dict[str, Any]  # ait.runner.error.v1: why the runner could not run the job


def create_runner_app(
    environment: Callable[[], Environment], stopping: Callable[[], bool] = lambda: False
) -> Protection:
    from aiworker.core.runner import fleet
    from aiworker.core.runner.runner_tokens import holder_of

    app = api_app("aiworker runner API", "/api/runner/v1/openapi.json")

    service = fleet.RunnerService(environment)

    def runner_holder(authorization: Annotated[str | None, Header()] = None) -> str:
        """The calling runner's token, checked; a lease answers only the token that
        claimed it (runner_tokens.holder_of)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not service.authorized(token.strip()):
            raise _Unauthorized
        return holder_of(token.strip())

    def runner_env(_holder: Annotated[str, Depends(runner_holder)]) -> Environment:
        return service.env()

    Env = Annotated[Environment, Depends(runner_env)]
    Holder = Annotated[str, Depends(runner_holder)]
    waiting = anyio.CapacityLimiter(MAX_WAITING)
    looks = SharedLooks(service)

    _handle_errors(app)

    @app.get("/api/runner/v1/health")
    def health(env: Env) -> dict[str, Any]:
        return {
            "ok": True,
            "contracts": list(fleet.CONTRACTS),
            "lease_seconds": env.loaded.config.runners.lease_seconds,
        }

    @app.post("/api/runner/v1/claim", response_model=None)
    async def claim(
        env: Env, holder: Holder, request: ClaimRequest, http: Request
    ) -> dict[str, Any] | Response:
        exact = (
            (request.exact.repository_index, request.exact.worker_job_index)
            if request.exact
            else None
        )
        indexes = (
            sorted(set(request.repository_indexes))
            if request.repository_indexes is not None
            else None
        )
        lease = await _long_poll(holder, request, indexes, exact, http)
        if lease is None:
            return Response(status_code=204)
        return fleet.lease_document(lease, env.loaded.config.runners.lease_seconds)

    @app.post("/api/runner/v1/jobs/{repository_index}/{worker_job_index}/heartbeat")
    def heartbeat(holder: Holder, pair: JobPair, proof: LeaseProof) -> dict[str, Any]:
        return {"lease_expires_at": service.beat(holder, pair, proof.lease_token)}

    def _finish(holder: str, pair: tuple[int, int], kind: str, body: Any) -> dict[str, Any]:
        document = body.model_dump(exclude={"lease_token"})
        status, delivery = service.finish(holder, pair, body.lease_token, kind, document)
        if status == "finished":
            failpoint("runner_api.after_finish")  # the fault tests' lost reply
        return {"status": status, "delivery": delivery}  # the stored one, if already

    @app.post("/api/runner/v1/jobs/{repository_index}/{worker_job_index}/complete")
    def complete(holder: Holder, pair: JobPair, body: Completion) -> dict[str, Any]:
        return _finish(holder, pair, "complete", body)

    @app.post("/api/runner/v1/jobs/{repository_index}/{worker_job_index}/fail")
    def fail(holder: Holder, pair: JobPair, body: Failure) -> dict[str, Any]:
        return _finish(holder, pair, "fail", body)

    @app.post("/api/runner/v1/jobs/{repository_index}/{worker_job_index}/release")
    def release(holder: Holder, pair: JobPair, proof: LeaseProof) -> dict[str, Any]:
        return {"released": service.release(holder, pair, proof.lease_token)}

    _transfer_routes(app, service, Holder)

    @app.get("/api/runner/v1/snapshots/{repository_index}/{snapshot_id}/{name}")
    def snapshot(
        holder: Holder,
        repository_index: Index,
        snapshot_id: str,
        name: str,
        lease: Annotated[str, Header(alias=fleet.LEASE_HEADER, max_length=64)] = "",
    ) -> FileResponse:
        path = service.snapshot_file(holder, repository_index, snapshot_id, name, lease)
        return FileResponse(path, media_type="application/octet-stream")

    async def _long_poll(
        holder: str,
        request: ClaimRequest,
        indexes: list[int] | None,
        exact: tuple[int, int] | None,
        http: Request,
    ) -> Any:
        """Claim now, or wait (without holding a thread) until a job is queued or the wait
        ends; a bounded number of waiting claims keeps threads free for heartbeats."""
        deadline = time.monotonic() + request.wait_ms / 1000
        key = (holder, request.worker_id, request.request_key)
        claim = (*key, indexes, exact, request.repeat_only)
        async with waiting:
            lease = await run_in_threadpool(service.claim_once, *claim)
            while lease is None and not request.repeat_only and time.monotonic() < deadline:
                await asyncio.sleep(POLL_STEP_S)
                if await http.is_disconnected():  # the runner went: lease it nothing
                    return None
                if stopping():  # the server stops: the runner asks again, of the next one
                    return None
                # A read, no write lock: waiting claims look often and claim (one write)
                # only when there is something to take.
                if await looks.anything_to_claim(indexes, exact):
                    lease = await run_in_threadpool(service.claim_once, *claim)
            return lease

    # A result carries two stream tails (64 KiB each, base64) and its records; an
    # artifact's chunk is at most transfers.CHUNK_BYTES.
    return Protection(app, set(), check_host=False, max_body=MAX_BODY)


class SharedLooks:
    """One read every POLL_STEP_S for all the claims waiting on the same jobs (most wait
    on any): each runner that waited looking for itself cost the controller about 5% of
    a core."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.looks: dict[Any, tuple[float, asyncio.Future[bool]]] = {}

    async def anything_to_claim(
        self, indexes: list[int] | None, exact: tuple[int, int] | None
    ) -> bool:
        looking = (tuple(indexes) if indexes is not None else None, exact)
        look = self.looks.get(looking)
        now = time.monotonic()
        if look is None or now - look[0] >= POLL_STEP_S:
            if len(self.looks) > MAX_WAITING:  # only the looks of this moment are kept
                self.looks = {k: v for k, v in self.looks.items() if now - v[0] < POLL_STEP_S}
            read = run_in_threadpool(self.service.anything_to_claim, indexes, exact)
            look = self.looks[looking] = (now, asyncio.ensure_future(read))
        return await asyncio.shield(look[1])  # a waiter that goes cancels no one's read


def _transfer_routes(app: FastAPI, service: Any, Holder: Any) -> None:
    """Artifacts a job sends under its lease (core/runner/transfers.py): GET says how
    much is held, PUT appends bytes from an offset; resumable across restarts."""
    from aiworker.core.runner import fleet

    Lease = Annotated[str, Header(alias=fleet.LEASE_HEADER, min_length=1, max_length=64)]
    Digest = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$")]

    @app.get("/api/runner/v1/jobs/{repository_index}/{worker_job_index}/artifacts/{digest}")
    def artifact_state(
        holder: Holder, pair: JobPair, digest: Digest, lease: Lease
    ) -> dict[str, Any]:
        """How much of an artifact this job has sent (to resume from there)."""
        return dict(service.transfer(holder, pair, lease, digest))

    @app.put("/api/runner/v1/jobs/{repository_index}/{worker_job_index}/artifacts/{digest}")
    async def artifact_chunk(
        holder: Holder,
        pair: JobPair,
        digest: Digest,
        lease: Lease,
        offset: Annotated[int, Query(ge=0)],
        size: Annotated[int, Query(ge=1)],
        http: Request,
    ) -> dict[str, Any]:
        """Bytes of an artifact from OFFSET (SIZE in all); the last ones publish it."""
        data = await http.body()
        state = await run_in_threadpool(
            service.transfer, holder, pair, lease, digest, (offset, size, data)
        )
        failpoint("runner_api.after_chunk")  # the transfer tests' controller killed mid-way
        return dict(state)


def _handle_errors(app: FastAPI) -> None:
    @app.exception_handler(AiworkerError)
    async def failed(_request: Request, exc: AiworkerError) -> JSONResponse:
        unavailable = isinstance(exc, (Unavailable, *SERVER_STATE))
        status = 503 if unavailable else 404 if exc.code == "not_found" else 400
        return error_response(status, exc.code, exc.message)

    @app.exception_handler(_Unauthorized)
    async def unauthorized(_request: Request, _exc: Exception) -> JSONResponse:
        return error_response(
            401, "unauthorized", "a runner token is required (Authorization: Bearer)"
        )

    @app.exception_handler(LeaseLost)
    async def lost(_request: Request, exc: Exception) -> JSONResponse:
        return error_response(409, "lease_lost", str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid"}
        where = ".".join(str(p) for p in first["loc"])
        return error_response(400, "invalid_input", f"{where}: {first['msg']}")


class _Unauthorized(Exception):
    pass
