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
from collections.abc import Sequence
from datetime import timedelta

from aiworker.config.loader import LoadedConfig, read_token
from aiworker.core.context import Environment
from aiworker.errors import ConfigInvalid
from aiworker.store.engine import Database
from aiworker.store.worker_jobs import Lease, claim, finish, heartbeat

log = logging.getLogger(__name__)
CONTRACTS = ("ait.runner.native-job.v3",)


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
    env: Environment, index: tuple[int, int], token: str, outcome: str, result: dict[str, object]
) -> tuple[str, dict[str, object]]:
    db = env.open_database()
    try:
        return finish(db, index, token, outcome, dict(result))
    finally:
        db.dispose()
