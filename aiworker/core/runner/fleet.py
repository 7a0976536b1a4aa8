"""The server side of the runner fleet: who may call (bearer tokens from the
configuration's `runners.tokens`), and claims, heartbeats and finishes of worker jobs
over their leases (store/worker_jobs.py). The controller alone decides whether a
transition is still admissible: a stale proof is refused, a finished job stays
finished. A claim may wait (long-poll) so a waiting runner picks a job up as soon as it
is queued, not at its next poll."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from aiworker.config.loader import LoadedConfig, read_token
from aiworker.contracts.runner import REQUEST_CONTRACT, Delivery, JobResult, RunnerError
from aiworker.core.context import Environment
from aiworker.core.runner.snapshots import snapshot_dir
from aiworker.errors import ConfigInvalid, InvalidInput
from aiworker.store.engine import Database
from aiworker.store.worker_jobs import (
    FAILED,
    SUCCEEDED,
    TERMINAL,
    Lease,
    LeaseLost,
    claim,
    finish,
    get_job,
    heartbeat,
)

log = logging.getLogger(__name__)
CONTRACTS = (REQUEST_CONTRACT,)


MIN_TOKEN_LENGTH = 32


def accepted_tokens(loaded: LoadedConfig) -> list[str]:
    """The runner tokens the configuration names; a source that is malformed or holds a
    token shorter than MIN_TOKEN_LENGTH is skipped (and `doctor` names it)."""
    base = loaded.path.parent
    tokens = []
    for identity in loaded.config.runners.tokens:
        try:
            token = read_token(identity, base)
        except ConfigInvalid as exc:
            log.warning("a runner token source is skipped: %s", exc.message)
            continue
        if token is not None and len(token) >= MIN_TOKEN_LENGTH:
            tokens.append(token)
    return tokens


def authorized(loaded: LoadedConfig, presented: str | None) -> bool:
    """Whether PRESENTED is an accepted token; every token is compared, by digest, so the
    time taken says nothing of which matched or how long they are."""
    if not presented:
        return False
    given = hashlib.sha256(presented.encode()).digest()
    found = False
    for token in accepted_tokens(loaded):
        found |= hmac.compare_digest(given, hashlib.sha256(token.encode()).digest())
    return found


def claim_once(
    env: Environment,
    db: Database,
    worker_id: str,
    request_key: str,
    repository_indexes: Sequence[int] | None,
    exact: tuple[int, int] | None,
) -> Lease | None:
    runners = env.loaded.config.runners
    return claim(
        db,
        worker_id,
        request_key,
        lease_for=timedelta(seconds=runners.lease_seconds),
        max_attempts=runners.max_attempts,
        repository_indexes=repository_indexes,
        exact=exact,
    )


def beat(env: Environment, index: tuple[int, int], token: str) -> str:
    db = env.open_database()
    try:
        lease_for = timedelta(seconds=env.loaded.config.runners.lease_seconds)
        return heartbeat(db, index, token, lease_for).isoformat()
    finally:
        db.dispose()


def finish_job(
    env: Environment, index: tuple[int, int], token: str, kind: str, body: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    db = env.open_database()
    try:
        return accept(db, index, token, kind, body)
    finally:
        db.dispose()


def accept(
    db: Database, index: tuple[int, int], token: str, kind: str, body: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """Record a runner's terminal transition of job INDEX under lease TOKEN: `complete`
    with the result of the request it was given, or `fail` with a runner error. What is
    stored (and answered) is the delivery (`ait.runner.delivery.v1`); a job this lease
    already finished answers "already finished" with the delivery stored then."""
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
    return finish(db, index, token, outcome, delivery.model_dump(mode="json"))


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
