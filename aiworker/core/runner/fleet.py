"""The server side of the runner fleet: who may call (bearer tokens from the
configuration's `runners.tokens`), and claims, heartbeats and finishes of worker jobs
over their leases (store/worker_jobs.py). The controller alone decides whether a
transition is still admissible: a stale proof is refused, a finished job stays
finished. A claim may wait (long-poll) so a waiting runner picks a job up as soon as it
is queued, not at its next poll."""

from __future__ import annotations

import hmac
import time
from collections.abc import Sequence
from datetime import timedelta

from aiworker.config.loader import LoadedConfig, read_token
from aiworker.core.context import Environment
from aiworker.store.worker_jobs import Lease, claim, finish, heartbeat

CONTRACTS = ("ait.runner.native-job.v3",)
MAX_WAIT_S = 30.0
WAIT_STEP_S = 0.05


def accepted_tokens(loaded: LoadedConfig) -> list[str]:
    base = loaded.path.parent
    return [t for i in loaded.config.runners.tokens if (t := read_token(i, base)) is not None]


def authorized(loaded: LoadedConfig, presented: str | None) -> bool:
    if not presented:
        return False
    given = presented.encode()
    return any(hmac.compare_digest(given, token.encode()) for token in accepted_tokens(loaded))


def claim_job(
    env: Environment,
    worker_id: str,
    request_key: str,
    repository_indexes: Sequence[int] | None,
    exact: tuple[int, int] | None,
    wait_s: float,
) -> Lease | None:
    """The next job for WORKER_ID, waiting up to WAIT_S (at most MAX_WAIT_S) for one."""
    runners = env.loaded.config.runners
    deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_WAIT_S)
    db = env.open_database()
    try:
        while True:
            lease = claim(
                db,
                worker_id,
                request_key,
                lease_for=timedelta(seconds=runners.lease_seconds),
                max_attempts=runners.max_attempts,
                repository_indexes=repository_indexes,
                exact=exact,
            )
            if lease is not None or time.monotonic() >= deadline:
                return lease
            time.sleep(WAIT_STEP_S)
    finally:
        db.dispose()


def beat(env: Environment, index: tuple[int, int], token: str) -> str:
    db = env.open_database()
    try:
        lease_for = timedelta(seconds=env.loaded.config.runners.lease_seconds)
        return heartbeat(db, index, token, lease_for).isoformat()
    finally:
        db.dispose()


def finish_job(
    env: Environment, index: tuple[int, int], token: str, outcome: str, result: dict[str, object]
) -> tuple[str, dict[str, object]]:
    db = env.open_database()
    try:
        return finish(db, index, token, outcome, dict(result))
    finally:
        db.dispose()
