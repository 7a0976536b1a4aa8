"""Worker job records as the controller reads and ends them: one job, the open jobs and
the snapshots they name; ending a job the controller gives up on, jobs left by a dead
controller, and a lease handed back unstarted. Leases themselves: worker_jobs.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, tuple_, update
from sqlalchemy.engine import Connection

from aiworker.store.engine import Database
from aiworker.store.tables import utcnow, worker_jobs
from aiworker.store.worker_jobs import (
    FAILED,
    LEASED,
    QUEUED,
    ended_failed,
    event,
    held,
    row_of,
)


@dataclass(frozen=True)
class Job:
    repository_index: int
    worker_job_index: int
    request: dict[str, Any]
    state: str
    attempt: int
    worker_id: str | None
    lease_token: str | None
    result: dict[str, Any] | None
    claim_key: str | None = None  # the runner API's: HOLDER:REQUEST_KEY
    lease_expires_at: datetime | None = None


def get_job(db: Database, index: tuple[int, int]) -> Job:
    with db.transaction() as connection:
        row = row_of(connection, index)
    return Job(
        int(row.repository_index),
        int(row.worker_job_index),
        dict(row.request),
        str(row.state),
        int(row.attempt_count),
        row.worker_id,
        row.lease_token,
        dict(row.result) if row.result is not None else None,
        row.claim_key,
        row.lease_expires_at,
    )


def abandon(db: Database, index: tuple[int, int], result: dict[str, Any]) -> bool:
    """End job INDEX as failed with RESULT unless it already ended; whatever lease it has
    is void from now (a runner still running it gets lease_lost). True if this ended it."""
    with db.transaction() as connection:
        return _end_open(connection, index, result)


def _end_open(connection: Connection, index: tuple[int, int], result: dict[str, Any]) -> bool:
    changed = connection.execute(
        update(worker_jobs)
        .where(
            worker_jobs.c.repository_index == index[0],
            worker_jobs.c.worker_job_index == index[1],
            worker_jobs.c.state.in_((QUEUED, LEASED)),
        )
        .values(**ended_failed(result, utcnow()))
    )
    if changed.rowcount == 1:
        event(connection, "abandoned", index, (None, FAILED), why=result.get("error"))
    return bool(changed.rowcount == 1)


def end_awaited_by(db: Database, attempt: int, result: dict[str, Any]) -> int:
    """End as failed, with RESULT, the open jobs whose delivery ATTEMPT awaited (it was
    abandoned: nobody will read them); how many."""
    job = (worker_jobs.c.repository_index, worker_jobs.c.worker_job_index)
    with db.transaction() as connection:
        awaited = connection.execute(
            select(*job).where(
                worker_jobs.c.attempt_id == attempt, worker_jobs.c.state.in_((QUEUED, LEASED))
            )
        ).all()
        return sum(_end_open(connection, (int(r[0]), int(r[1])), result) for r in awaited)


def end_orphans(
    db: Database, older_than: timedelta, result: dict[str, Any], alive: Callable[[str], bool]
) -> int:
    """End as failed, with RESULT, the jobs queued longer than OLDER_THAN and those whose
    lease expired and whose holder is not ALIVE (by its worker id): the embedded runner
    claims each job the moment it is queued and heartbeats while it runs, so these lost
    their controller process; one whose lease only looks expired (the wall clock was set
    forward) is left to its holder. Returns how many."""
    now = utcnow()
    job = (worker_jobs.c.repository_index, worker_jobs.c.worker_job_index)
    with db.transaction() as connection:
        lapsed = connection.execute(
            select(*job, worker_jobs.c.worker_id).where(
                worker_jobs.c.state == LEASED, worker_jobs.c.lease_expires_at <= now
            )
        ).all()
        dead = [(r[0], r[1]) for r in lapsed if not alive(str(r[2] or ""))]
        changed = connection.execute(
            update(worker_jobs)
            .where(
                or_(
                    and_(
                        worker_jobs.c.state == QUEUED, worker_jobs.c.created_at < now - older_than
                    ),
                    and_(worker_jobs.c.state == LEASED, tuple_(*job).in_(dead)),
                )
            )
            .values(**ended_failed(result, now))
        )
        if changed.rowcount:
            event(connection, "orphans_ended", (0, 0), (None, FAILED), count=changed.rowcount)
    return int(changed.rowcount)


def release(db: Database, index: tuple[int, int], token: str) -> bool:
    """Hand job INDEX back under its live lease TOKEN (a runner stopping before it started
    the job): queued again at once instead of after the lease. The attempt still counts,
    so releasing cannot run a job more often than max_attempts. True if released."""
    with db.transaction() as connection:
        changed = connection.execute(
            update(worker_jobs)
            .where(*held(index, token))
            .values(
                state=QUEUED,
                lease_token=None,
                lease_expires_at=None,
                claim_key=None,
                worker_id=None,
                version=worker_jobs.c.version + 1,
                updated_at=utcnow(),
            )
        )
        if changed.rowcount == 1:
            event(connection, "released", index, (LEASED, QUEUED))
    return bool(changed.rowcount == 1)


def leased_snapshot(
    db: Database, repository_index: int, snapshot_id: str, lease: str, holder: str | None = None
) -> bool:
    """Whether the job leased under LEASE (by HOLDER, when given: the runner API's claim
    keys start with it) names snapshot SNAPSHOT_ID of REPOSITORY_INDEX: as its source (a
    job of that repository) or as a locked external ("INDEX:ID")."""
    external = f"{repository_index}:{snapshot_id}"
    with db.read() as session:
        rows = session.execute(
            select(worker_jobs.c.repository_index, worker_jobs.c.request).where(
                worker_jobs.c.state == LEASED,
                worker_jobs.c.lease_token == lease,
                *([worker_jobs.c.claim_key.startswith(f"{holder}:")] if holder else []),
            )
        ).all()
    for row in rows:
        source = dict(row.request).get("source") or {}
        if row.repository_index == repository_index and source.get("snapshot_id") == snapshot_id:
            return True
        if external in (source.get("external") or {}).values():
            return True
    return False


def open_requests(db: Database, repository_index: int) -> list[dict[str, Any]]:
    """The requests of REPOSITORY_INDEX's jobs that have not ended."""
    with db.transaction() as connection:
        rows = connection.execute(
            select(worker_jobs.c.request).where(
                worker_jobs.c.repository_index == repository_index,
                worker_jobs.c.state.in_((QUEUED, LEASED)),
            )
        ).all()
    return [dict(r.request) for r in rows]
