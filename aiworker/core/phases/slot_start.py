"""How a slot's phase (plan, implement, repair) takes up its claim: the task must be
claimed on that slot in the state the phase starts from; the phase holds slot-N.lock
(inherited from the tick, or taken now) and records its own pid in the claim, which is
how recovery tells a live job from a dead one (tasks/recovery.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from aiworker import logs
from aiworker.core.context import Environment, hold_job_lock
from aiworker.core.tasks.lifecycle import advance
from aiworker.errors import Conflict, InvalidInput
from aiworker.runtime.locks import FileLock
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task


@dataclass(frozen=True)
class Started:
    task: Task
    repo: Repository
    lock: FileLock | None  # taken by this process (released by the phase guard), or None
    version: int
    token: str  # SLOT-pidPID, now in the claim


def load_on_slot(
    db: Database, task_id: int, slot: int, state: str, what: str, kind: str | None = None
) -> tuple[Task, Repository]:
    """TASK_ID with its repository, which must be in STATE on SLOT (and of KIND)."""
    logs.task_id.set(task_id)  # this job's log lines name its task from here on
    with db.read() as session:
        task = session.get(Task, task_id)
        if task is None:
            raise InvalidInput(f"no task {task_id}")
        repo = session.get(Repository, task.repository_id)
        assert repo is not None
    host_differs = task.claim_host not in (None, db.host)
    if task.state != state or task.claim_slot != slot or kind not in (None, task.kind):
        raise Conflict(
            f"task {task_id} is {task.state} on slot {task.claim_slot}, not {what} on slot {slot}"
        )
    if host_differs:
        raise Conflict(f"task {task_id} is claimed on controller {task.claim_host}'s slot {slot}")
    return task, repo


def take_up(
    env: Environment,
    db: Database,
    task: Task,
    repo: Repository,
    slot: int,
    to_state: str,
    reason: str,
    actor: str,
) -> Started:
    lock = hold_job_lock(env, f"slot-{slot}")
    token = f"{slot}-pid{os.getpid()}"
    try:
        with db.write() as session:
            version = advance(
                session,
                task.id,
                task.state,
                task.version,
                to_state,
                reason,
                actor=actor,
                kind="job.started" if to_state == task.state else "task.transition",
                follow_data_changes=True,  # the tick named this job's pid meanwhile
                claim_token=token,
            )
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return Started(task, repo, lock, version, token)
