"""Worker jobs and their leases: the controller's side of the runner fleet.

A job is keyed by (repository_index, worker_job_index), never by a repository's name.
States: queued -> leased -> succeeded | failed. A claim takes the oldest claimable job
(queued, or leased with an expired lease while attempts remain) in one statement under
the write lock, with a fresh lease token (the proof every later call carries) and the
attempt count raised. A claim repeated with the same request key while its lease holds
gets the same job and lease back (a lost reply does not strand a job). A lease holds
until its job ends or another claim takes the job over, which its expiry allows: its
holder's heartbeat, result, transfer or release past the expiry, with nobody having
taken the job meanwhile, is accepted (a controller's wall clock set forward costs no
work unless another runner claims the job first; a late result is still the only one).
Finishing needs the lease proof, and a second finish of a finished job answers with the
stored outcome, which is final.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, insert, or_, select, true, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from aiworker.store.engine import Database
from aiworker.store.tables import events, utcnow, worker_jobs

QUEUED, LEASED, SUCCEEDED, FAILED = "queued", "leased", "succeeded", "failed"
TERMINAL = (SUCCEEDED, FAILED)


class LeaseLost(Exception):
    """The lease proof does not hold (taken over, ended, or the job is gone)."""


@dataclass(frozen=True)
class Lease:
    repository_index: int
    worker_job_index: int
    request: dict[str, Any]
    token: str
    expires_at: datetime
    attempt: int

    def remaining_ms(self) -> int:
        """What is left of the lease now, by the controller's clock."""
        return max(0, int((self.expires_at - utcnow()).total_seconds() * 1000))


def enqueue(
    db: Database, repository_index: int, request: dict[str, Any], attempt: int | None = None
) -> int:
    """Queue REQUEST for repository REPOSITORY_INDEX, its delivery awaited by ATTEMPT;
    returns its worker job index (the next one: on a database without SQLite's write
    lock, a racing enqueuer's index is taken, and the next is tried)."""
    for _ in range(20):
        try:
            return _enqueue(db, repository_index, request, attempt)
        except IntegrityError:
            continue
    raise RuntimeError(f"could not enqueue a worker job for repository {repository_index}")


def _enqueue(
    db: Database, repository_index: int, request: dict[str, Any], attempt: int | None
) -> int:
    with db.transaction() as connection:
        last = connection.scalar(
            select(func.max(worker_jobs.c.worker_job_index)).where(
                worker_jobs.c.repository_index == repository_index
            )
        )
        index = int(last or 0) + 1
        now = utcnow()
        connection.execute(
            insert(worker_jobs).values(
                repository_index=repository_index,
                worker_job_index=index,
                request=request,
                attempt_id=attempt,
                state=QUEUED,
                version=1,
                attempt_count=0,
                created_at=now,
                updated_at=now,
            )
        )
    return index


def event(
    connection: Connection,
    kind: str,
    index: tuple[int, int],
    moved: tuple[str | None, str],
    actor: str | None = None,
    **data: Any,
) -> None:
    """One audit event of worker job INDEX (`worker_job.KIND`), in the same transaction
    as the change it records."""
    connection.execute(
        insert(events).values(
            kind=f"worker_job.{kind}",
            from_state=moved[0],
            to_state=moved[1],
            actor=actor[:100] if actor else None,
            data={"repository_index": index[0], "worker_job_index": index[1], **data},
            created_at=utcnow(),
        )
    )


def _lease(row: Any) -> Lease:
    return Lease(
        int(row.repository_index),
        int(row.worker_job_index),
        dict(row.request),
        str(row.lease_token),
        row.lease_expires_at,
        int(row.attempt_count),
    )


def claim(
    db: Database,
    worker_id: str,
    claim_key: str,
    *,
    lease_for: timedelta,
    max_attempts: int,
    repository_indexes: Sequence[int] | None = None,
    exact: tuple[int, int] | None = None,
    repeat_only: bool = False,
) -> Lease | None:
    """The next job for WORKER_ID (of REPOSITORY_INDEXES, or exactly EXACT), leased for
    LEASE_FOR; the same lease again for a repeated CLAIM_KEY; None when nothing is
    claimable. REPEAT_ONLY: only the lease CLAIM_KEY already has, never a new one."""
    with db.transaction() as connection:
        now = utcnow()
        again = connection.execute(
            select(worker_jobs).where(
                worker_jobs.c.claim_key == claim_key,
                worker_jobs.c.worker_id == worker_id,
                worker_jobs.c.state == LEASED,
                worker_jobs.c.lease_expires_at > now,
            )
        ).first()
        if again is not None or repeat_only:
            return None if again is None else _lease(again)
        # A job of this claim's (its filters: an exact claim touches no other job) whose
        # every attempt's lease expired, or that was handed back unrun on each (runners
        # stopped mid-claim, or with no room for it), ends failed, with the reason: never
        # left leased for ever, never holding the head of the queue, never run again.
        for state, spent, how in (
            (LEASED, worker_jobs.c.lease_expires_at <= now, "the lease expired on each of"),
            (QUEUED, true(), "handed back unrun on each of its"),
        ):
            why = f"{how} {max_attempts} attempts"
            ended = connection.execute(
                update(worker_jobs)
                .where(
                    worker_jobs.c.state == state,
                    spent,
                    worker_jobs.c.attempt_count >= max_attempts,
                    *_filters(repository_indexes, exact),
                )
                .values(**ended_failed({"error": why}, now))
                .returning(worker_jobs.c.repository_index, worker_jobs.c.worker_job_index)
            ).all()
            for job in ended:
                event(connection, "expired", (job[0], job[1]), (state, FAILED), why=why)
        claimable = _claimable(now, max_attempts)
        conditions = [claimable, *_filters(repository_indexes, exact)]
        oldest = connection.execute(
            select(
                worker_jobs.c.repository_index, worker_jobs.c.worker_job_index, worker_jobs.c.state
            )
            .where(*conditions)
            .order_by(
                worker_jobs.c.created_at,
                worker_jobs.c.repository_index,
                worker_jobs.c.worker_job_index,
            )
            .limit(1)
        ).first()
        if oldest is None:
            return None
        row = connection.execute(
            update(worker_jobs)
            .where(
                worker_jobs.c.repository_index == oldest[0],
                worker_jobs.c.worker_job_index == oldest[1],
                claimable,  # still claimable: never two leases at once, whatever the database
            )
            .values(
                state=LEASED,
                lease_token=secrets.token_hex(16),
                lease_expires_at=now + lease_for,
                attempt_count=worker_jobs.c.attempt_count + 1,
                version=worker_jobs.c.version + 1,
                claim_key=claim_key,
                worker_id=worker_id,
                updated_at=now,
            )
            .returning(worker_jobs)
        ).first()
        if row is not None:
            moved = (str(oldest.state), LEASED)
            event(connection, "claimed", oldest[:2], moved, worker_id, attempt=row.attempt_count)
    return None if row is None else _lease(row)


def _claimable(now: datetime, max_attempts: int) -> Any:
    return or_(
        and_(worker_jobs.c.state == QUEUED, worker_jobs.c.attempt_count < max_attempts),
        and_(
            worker_jobs.c.state == LEASED,
            worker_jobs.c.lease_expires_at <= now,
            worker_jobs.c.attempt_count < max_attempts,
        ),
    )


def _filters(repository_indexes: Sequence[int] | None, exact: tuple[int, int] | None) -> list[Any]:
    conditions: list[Any] = []
    if repository_indexes is not None:
        conditions.append(worker_jobs.c.repository_index.in_(list(repository_indexes)))
    if exact is not None:
        conditions += [
            worker_jobs.c.repository_index == exact[0],
            worker_jobs.c.worker_job_index == exact[1],
        ]
    return conditions


def anything_claimable(
    db: Database,
    *,
    max_attempts: int,
    repository_indexes: Sequence[int] | None = None,
    exact: tuple[int, int] | None = None,
) -> bool:
    """Whether claim() would find a job now: a read, no write lock, so waiting claims can
    look often and claim only when there is something to take."""
    now = utcnow()
    exhausted = and_(  # claim() ends these as failed: that is something to do too
        or_(worker_jobs.c.state == QUEUED, worker_jobs.c.lease_expires_at <= now),
        worker_jobs.c.state.in_((QUEUED, LEASED)),
        worker_jobs.c.attempt_count >= max_attempts,
    )
    with db.read() as session:
        found = session.execute(
            select(worker_jobs.c.worker_job_index)
            .where(
                or_(_claimable(now, max_attempts), exhausted),
                *_filters(repository_indexes, exact),
            )
            .limit(1)
        ).first()
    return found is not None


def held(index: tuple[int, int], token: str) -> list[Any]:
    """The conditions of job INDEX being leased under TOKEN."""
    return [
        worker_jobs.c.repository_index == index[0],
        worker_jobs.c.worker_job_index == index[1],
        worker_jobs.c.lease_token == token,
        worker_jobs.c.state == LEASED,
    ]


def ended_failed(result: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The values that end a job as failed with RESULT (its lease void from now)."""
    return {
        "state": FAILED,
        "lease_token": None,
        "result": result,
        "version": worker_jobs.c.version + 1,
        "updated_at": now,
    }


def row_of(connection: Connection, index: tuple[int, int]) -> Any:
    row = connection.execute(
        select(worker_jobs).where(
            worker_jobs.c.repository_index == index[0],
            worker_jobs.c.worker_job_index == index[1],
        )
    ).first()
    if row is None:
        raise LeaseLost(f"no worker job {index[0]}/{index[1]}")
    return row


def heartbeat(db: Database, index: tuple[int, int], token: str, lease_for: timedelta) -> datetime:
    """Extend the live lease TOKEN on job INDEX; returns its new expiry."""
    with db.transaction() as connection:
        now = utcnow()
        row = row_of(connection, index)
        if row.state != LEASED or row.lease_token != token:
            raise LeaseLost(f"the lease on worker job {index[0]}/{index[1]} no longer holds")
        expires = now + lease_for
        changed = connection.execute(
            update(worker_jobs)
            .where(*held(index, token))
            .values(lease_expires_at=expires, updated_at=now)
        )
        if changed.rowcount != 1:
            raise LeaseLost(f"the lease on worker job {index[0]}/{index[1]} no longer holds")
    return expires


def finish(
    db: Database,
    index: tuple[int, int],
    token: str,
    outcome: str,
    result: dict[str, Any],
    also: Callable[[Connection], object] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Record OUTCOME (succeeded or failed) under lease TOKEN, and ALSO's writes (the
    result's artifact records) in the same transaction. Returns ("finished", result)
    or, for a job this lease already finished, ("already finished", the stored result)."""
    if outcome not in TERMINAL:
        raise ValueError(f"unknown outcome {outcome!r}")
    with db.transaction() as connection:
        now = utcnow()
        row = row_of(connection, index)
        if row.lease_token != token:
            raise LeaseLost(f"worker job {index[0]}/{index[1]} is leased under another proof")
        if row.state in TERMINAL:
            return "already finished", dict(row.result or {})
        changed = connection.execute(
            update(worker_jobs)
            .where(*held(index, token))
            .values(
                state=outcome,
                result=result,
                version=worker_jobs.c.version + 1,
                updated_at=now,
            )
        )
        if changed.rowcount != 1:
            raise LeaseLost(f"worker job {index[0]}/{index[1]} changed under this lease")
        event(connection, "finished", index, (LEASED, outcome), row.worker_id)
        if also is not None:
            also(connection)
    return "finished", result
