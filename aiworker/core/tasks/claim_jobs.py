"""The claim names the process that took it up: recovery then knows a holder that died
without waiting out the hand-over grace that a claim made by hand gets."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from aiworker.core.context import Environment, hold_job_lock
from aiworker.core.tasks.lifecycle import advance, try_advance
from aiworker.core.tasks.states import TaskState as S
from aiworker.runtime.locks import FileLock
from aiworker.store.engine import Database
from aiworker.store.tasks import task_state

if TYPE_CHECKING:  # the tick imports this module; the ORM models would cost it 12 ms
    from aiworker.store.models import Task


def claim_token(slot: int, pid: int | None = None) -> str:
    """What a claim records of the job that took it up on SLOT (this process: PID None)."""
    return f"{slot}-pid{pid or os.getpid()}"


def take_up(
    env: Environment, db: Database, task: Task, slot: int, holds: str, why: str, actor: str
) -> FileLock | None:
    """Hold slot SLOT's lock and take TASK, claimed on it, up: it moves to HOLDS (a repair
    episode stays repairing) and its claim names this process, as name_job does, which is
    how recovery tells a live job. Returns what hold_job_lock returns; TASK follows."""
    lock = hold_job_lock(env, f"slot-{slot}")
    try:
        with db.write() as session:
            task.version = advance(
                session,
                task.id,
                task.state,
                task.version,
                holds,
                why,
                actor=actor,
                kind="job.started" if holds == task.state else "task.transition",
                follow_data_changes=True,  # the tick named this job's pid meanwhile
                claim_token=claim_token(slot),
            )
        task.state = holds
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def name_job(db: Database, task_id: int, slot: int, pid: int | None, unit: str = "") -> None:
    """Record the job just started on SLOT in the claim of TASK_ID (still claimed, or a
    repair episode waiting for it): its PID, or the systemd UNIT that starts it (the unit's
    own process names itself when it takes the task up). A task that moved meanwhile is
    left alone: the job finds that itself and stops."""
    with db.read_connection() as connection:
        current = task_state(connection, task_id)
    if current is None or current[0] not in (S.CLAIMED, S.REPAIRING):
        return
    how = f"as {unit}" if unit else f"as pid {pid}"
    with db.transaction() as connection:
        try_advance(
            connection,
            task_id,
            current[0],
            current[1],
            current[0],
            f"started on slot {slot} {how}",
            actor=f"slot-{slot}",
            kind="job.started",
            data={"slot": slot, "pid": pid, "unit": unit or None},
            claim_token=f"{slot}{UNIT_MARK}" if unit else claim_token(slot, pid),
        )


UNIT_MARK = "-unit"


def started_as_unit(token: str | None) -> bool:
    """Whether a tick started the claim's job as a systemd unit (launcher.py)."""
    return (token or "").endswith(UNIT_MARK)
