"""Stopping the job on a slot: only the claimed task's own job, never whatever holds a lock.

A tick holds every free slot's lock under its own pid while it claims, so the lock's
holder is not necessarily a job. The job to stop is the one the claim names (the tick or
the phase records its pid in the claim token), and only while that process still runs a
phase of that task. The request is recorded first (`slot.stop_requested`, naming the
pid); SIGTERM then lets the phase guard close its attempt as `stopped`, its budget
charge given back (the stop is no failure of the work), and land the task where it
retries.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.tasks.recovery import job_alive, launched_pid
from aiworker.errors import Conflict, InvalidInput
from aiworker.store.task_records import claims_by_slot
from aiworker.store.tasks import STOP_REQUESTED, append_event


def stop_slot_job(env: Environment, slot: int, by: str) -> dict[str, Any]:
    """Stop the job running on SLOT, as BY asked."""
    shares = env.loaded.config.shares
    if not 1 <= slot <= shares:
        raise InvalidInput(f"slot must be between 1 and shares ({shares})")
    db = env.open_database()
    try:
        with db.read() as session:
            task = claims_by_slot(session, db.host).get(slot)
            claim = (task.id, task.claim_token) if task is not None else None
    finally:
        db.dispose()
    if claim is None:
        raise Conflict(f"slot {slot} runs no job")
    task_id, token = claim
    pid = launched_pid(token)
    if pid is None or not job_alive(pid, task_id):
        raise Conflict(f"slot {slot} has task {task_id} claimed, but no running job of it")
    why = f"stopped by an operator ({by}) on slot {slot}"
    db = env.open_database()
    try:
        with db.write() as session:  # before the signal: the job's guard reads it
            data = {"slot": slot, "pid": pid, "reason": why}
            append_event(session, STOP_REQUESTED, task_id=task_id, actor=by, data=data)
    finally:
        db.dispose()
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise Conflict(f"the job of task {task_id} on slot {slot} has just ended") from None
    return {"slot": slot, "task": task_id, "stopped": pid}
