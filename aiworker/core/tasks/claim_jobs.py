"""The claim names the process that took it up: recovery then knows a holder that died
without waiting out the hand-over grace that a claim made by hand gets."""

from __future__ import annotations

from aiworker.core.tasks.lifecycle import try_advance
from aiworker.core.tasks.states import TaskState as S
from aiworker.store.engine import Database
from aiworker.store.tasks import task_state


def name_job(db: Database, task_id: int, slot: int, pid: int) -> None:
    """Record PID, just started on SLOT, in the claim of TASK_ID (still claimed, or a
    repair episode waiting for it); a task that moved meanwhile is left alone: the job
    finds that itself and stops."""
    with db.read_connection() as connection:
        current = task_state(connection, task_id)
    if current is None or current[0] not in (S.CLAIMED, S.REPAIRING):
        return
    with db.transaction() as connection:
        try_advance(
            connection,
            task_id,
            current[0],
            current[1],
            current[0],
            f"started on slot {slot} as pid {pid}",
            actor=f"slot-{slot}",
            kind="job.started",
            data={"slot": slot, "pid": pid},
            claim_token=f"{slot}-pid{pid}",
        )
