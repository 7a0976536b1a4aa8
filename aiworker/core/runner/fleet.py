"""The server side of the runner fleet: who may call (bearer tokens from the
configuration's `runners.tokens`, runner_tokens.py), and claims, heartbeats and
finishes of worker jobs over their leases (store/worker_jobs.py). The controller alone
decides whether a transition is still admissible: a stale proof is refused, a finished
job stays finished. A claim may wait (long-poll) so a waiting runner picks a job up as
soon as it is queued, not at its next poll."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from aiworker.adapters import runner_api
from aiworker.contracts.runner import REQUEST_CONTRACT, Delivery, JobResult, RunnerError
from aiworker.core.context import Environment
from aiworker.core.evidence.artifacts import artifact_files
from aiworker.core.runner.runner_tokens import AcceptedTokens
from aiworker.core.runner.snapshots import snapshot_dir
from aiworker.core.runner.transfers import (
    lease_holds,
    receive_chunk,
    result_artifacts,
    transfer_state,
)
from aiworker.errors import InvalidInput
from aiworker.runtime.artifact_files import ArtifactFiles
from aiworker.store.engine import Database
from aiworker.store.worker_job_records import get_job, leased_snapshot, release
from aiworker.store.worker_jobs import (
    FAILED,
    SUCCEEDED,
    TERMINAL,
    Lease,
    LeaseLost,
    anything_claimable,
    claim,
    finish,
    heartbeat,
)

LEASE_HEADER = runner_api.LEASE_HEADER  # the lease a snapshot download is for
CONTRACTS = (REQUEST_CONTRACT,)


def lease_document(lease: Lease, lease_seconds: int) -> dict[str, Any]:
    """A claim's answer: the job, its request and the lease proof, with what is left of
    the lease by the controller's clock."""
    return {
        "repository_index": lease.repository_index,
        "worker_job_index": lease.worker_job_index,
        "request": lease.request,
        "lease_token": lease.token,
        "lease_expires_at": lease.expires_at.isoformat(),
        "attempt": lease.attempt,
        "lease_seconds": lease_seconds,
        "lease_remaining_ms": lease.remaining_ms(),
    }


class RunnerService:
    """What the runner API serves from: the configuration and the accepted tokens'
    digests, read again at most every REFRESH_S (a removed token file stops working
    within that), and one database for the process, opened (and checked) once."""

    REFRESH_S = 1.0

    def __init__(self, environment: Callable[[], Environment]) -> None:
        self._environment = environment
        self._lock = threading.Lock()
        self._read_at = -self.REFRESH_S
        self._env: Environment | None = None
        self._tokens = AcceptedTokens()
        self._db: Database | None = None

    def env(self) -> Environment:
        with self._lock:
            if self._env is None or time.monotonic() - self._read_at >= self.REFRESH_S:
                env = self._environment()
                self._tokens.read(env.loaded)
                self._env, self._read_at = env, time.monotonic()
            return self._env

    def db(self) -> Database:
        env = self.env()
        with self._lock:
            if self._db is None:
                self._db = env.open_database()
            return self._db

    def authorized(self, presented: str | None) -> bool:
        """Whether PRESENTED is an accepted runner token, as the configuration is now."""
        self.env()
        return self._tokens.accepts(presented)

    def claim_once(
        self,
        holder: str,
        worker_id: str,
        request_key: str,
        repository_indexes: Sequence[int] | None,
        exact: tuple[int, int] | None,
        repeat_only: bool = False,
    ) -> Lease | None:
        """A claim by the runner token HOLDER stands for; a repeated REQUEST_KEY finds the
        lease again only for that token."""
        runners = self.env().loaded.config.runners
        return claim(
            self.db(),
            worker_id,
            f"{holder}:{request_key}",
            lease_for=timedelta(seconds=runners.lease_seconds),
            max_attempts=runners.max_attempts,
            repository_indexes=repository_indexes,
            exact=exact,
            repeat_only=repeat_only,
        )

    def anything_to_claim(
        self, repository_indexes: Sequence[int] | None, exact: tuple[int, int] | None
    ) -> bool:
        return anything_claimable(
            self.db(),
            max_attempts=self.env().loaded.config.runners.max_attempts,
            repository_indexes=repository_indexes,
            exact=exact,
        )

    def _held_by(self, index: tuple[int, int], holder: str) -> None:
        """Refuse a lease proof from any token but the one that claimed the lease."""
        key = get_job(self.db(), index).claim_key or ""
        if not key.startswith(f"{holder}:"):
            raise LeaseLost(
                f"worker job {index[0]}/{index[1]} was claimed with another runner's token"
            )

    def beat(self, holder: str, index: tuple[int, int], token: str) -> str:
        self._held_by(index, holder)
        lease_for = timedelta(seconds=self.env().loaded.config.runners.lease_seconds)
        return heartbeat(self.db(), index, token, lease_for).isoformat()

    def finish(
        self, holder: str, index: tuple[int, int], token: str, kind: str, body: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        self._held_by(index, holder)
        env = self.env()
        days = env.loaded.config.retention.artifact_days
        return accept(self.db(), index, token, kind, body, artifact_files(env.state_dir), days)

    def transfer(
        self,
        holder: str,
        index: tuple[int, int],
        token: str,
        digest: str,
        chunk: tuple[int, int, bytes] | None = None,
    ) -> dict[str, Any]:
        """How much of DIGEST the job of lease TOKEN has sent, after appending CHUNK
        (offset, size in all, bytes) when given."""
        lease_holds(self.db(), index, token, holder)
        files = artifact_files(self.env().state_dir)
        if chunk is None:
            return transfer_state(files, digest)
        return receive_chunk(files, digest, *chunk)

    def release(self, holder: str, index: tuple[int, int], token: str) -> bool:
        self._held_by(index, holder)
        return release(self.db(), index, token)

    def snapshot_file(
        self, holder: str, index: int, snapshot_id: str, name: str, lease: str
    ) -> Path:
        """A file of a snapshot that the job leased under LEASE (claimed with the token
        HOLDER stands for) names, no other."""
        leased = lease and leased_snapshot(self.db(), index, snapshot_id, lease, holder)
        if not leased:
            raise InvalidInput(
                f"no job of this lease names snapshot {snapshot_id}", code="not_found"
            )
        return snapshot_file(self.env().state_dir, index, snapshot_id, name)


def accept(
    db: Database,
    index: tuple[int, int],
    token: str,
    kind: str,
    body: dict[str, Any],
    files: ArtifactFiles | None = None,
    days: int = 7,
) -> tuple[str, dict[str, Any]]:
    """Record a runner's terminal transition of job INDEX under lease TOKEN: `complete`
    with the result of the request it was given, or `fail` with a runner error. What is
    stored (and answered) is the delivery (`ait.runner.delivery.v1`); a job this lease
    already finished answers "already finished" with the delivery stored then. A result
    naming artifacts is accepted only once FILES holds each whole; they are recorded
    with the job, kept DAYS."""
    job = get_job(db, index)
    if job.lease_token != token:
        raise LeaseLost(f"worker job {index[0]}/{index[1]} is leased under another proof")
    if job.state in TERMINAL:
        return "already finished", dict(job.result or {})
    result = error = None
    try:
        if kind == "complete":
            result = JobResult.model_validate(body.get("result"))
        else:
            error = RunnerError.model_validate(body.get("error"))
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(f"{kind}: {where}: {first['msg']}") from None
    request = job.request
    if result is not None and (result.label, result.suite_id) != (
        request.get("label"),
        request.get("suite_id"),
    ):
        raise InvalidInput(f"the result is not of worker job {index[0]}/{index[1]}'s request")
    records = result_artifacts(files, result, index, days) if result is not None else None
    delivery = Delivery(
        repository_index=index[0],
        worker_job_index=index[1],
        attempt=job.attempt,
        worker_id=job.worker_id or "",
        outcome="completed" if result is not None else "failed",
        result=result,
        error=error,
        accepted_at=datetime.now(UTC).isoformat(),
    )
    outcome = SUCCEEDED if result is not None else FAILED
    return finish(db, index, token, outcome, delivery.model_dump(mode="json"), records)


def snapshot_file(state_dir: Path, index: int, snapshot_id: str, name: str) -> Path:
    """A published snapshot's manifest or pack, or InvalidInput when there is none."""
    if not re.fullmatch(r"[0-9a-f]{40}", snapshot_id) or not re.fullmatch(
        r"manifest\.json|pack-[0-9]{1,9}", name
    ):
        raise InvalidInput(f"no snapshot file {snapshot_id}/{name}", code="not_found")
    path = snapshot_dir(state_dir, index, snapshot_id) / name
    if not path.is_file():
        raise InvalidInput(f"no snapshot file {snapshot_id}/{name}", code="not_found")
    return path
