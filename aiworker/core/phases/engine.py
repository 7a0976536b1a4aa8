"""The one driver of every phase and step (table.py declares them): it opens the
database, loads the task and checks that it may start, takes the lock and the task up,
checks the budget, runs the body inside the guard, and makes the one last move from
the Outcome the body returns.

A move the task refuses (it was paused or cancelled meanwhile, or moved on) is handled
here alone: that decision stands and the work is retained with the reason; a result for
a scope that poll replaced meanwhile sends a still-claimed task back to its retry state.
"""

from __future__ import annotations

import logging
import os

from aiworker import logs
from aiworker.core.context import Environment, hold_job_lock
from aiworker.core.guests.backends import backend_for
from aiworker.core.phases.job import Job
from aiworker.core.phases.outcome import Outcome, landed
from aiworker.core.phases.table import SLOT, Phase
from aiworker.core.tasks.budgets import RELEASE, budget_spent, land_after_failure
from aiworker.core.tasks.hosts import hold_task_lock
from aiworker.core.tasks.lifecycle import Refusal, TransitionRefused, advance
from aiworker.core.tasks.notices import comment_on_issue
from aiworker.core.tasks.repairs import request_repair
from aiworker.errors import Conflict
from aiworker.runtime.failpoints import failpoint
from aiworker.runtime.locks import FileLock
from aiworker.store.engine import Database
from aiworker.store.models import Repository
from aiworker.store.publications import current_publication
from aiworker.store.task_records import existing_task

log = logging.getLogger(__name__)


class BudgetSpent(Conflict):
    code = "budget_spent"


def run_phase(env: Environment, phase: Phase, task_id: int, slot: int | None = None) -> Outcome:
    """Run PHASE for TASK_ID (on SLOT, for a slot phase); the Outcome it ended with."""
    db = env.open_database()
    try:
        job = _load(env, db, phase, task_id, slot)
        job.lock = _take_up(job)
        exhausted = budget_spent(env, db, task_id, phase.name)
        if exhausted:
            try:
                _retry(job, exhausted, job.retry)
            finally:
                if job.lock is not None:
                    job.lock.release()
            raise BudgetSpent(f"task {task_id}: the {phase.name} budget is spent")
        job.backend = backend_for(env, phase.name) if phase.backend else None
        job.recover = lambda reason: _retry(job, reason, job.retry)
        with job:
            decided: Outcome | None = None
            try:
                decided = phase.run()(job)
                state, refusal = _move(job, decided)
            except TransitionRefused as exc:  # the task moved meanwhile
                if job.report is None:
                    raise
                outcome = decided or Outcome(job.report)  # refused in the body: no decision
                state, refusal = _refused(job, outcome, exc.refusal)
            else:
                outcome = decided
            landed(outcome.report, state, refusal)
        failpoint(f"{phase.name}.after_record")
        return outcome
    finally:
        db.dispose()


def _load(env: Environment, db: Database, phase: Phase, task_id: int, slot: int | None) -> Job:
    logs.task_id.set(task_id)  # every log line of this job names its task from here on
    with db.read() as session:
        task = existing_task(session, task_id)
        repo = session.get(Repository, task.repository_id)
        publication = current_publication(session, task_id)
    assert repo is not None
    starts = " or ".join(sorted(phase.starts))
    where = f" on slot {task.claim_slot}" if phase.lock == SLOT else ""
    if task.state not in phase.starts or (phase.lock == SLOT and task.claim_slot != slot):
        wanted = f"{starts} on slot {slot}" if phase.lock == SLOT else starts
        raise Conflict(f"task {task_id} is {task.state}{where}, not {wanted}")
    if task.kind not in phase.kinds:
        raise Conflict(f"task {task_id} is a {task.kind} task; {phase.command} is not for it")
    if phase.lock == SLOT and task.claim_host not in (None, db.host):
        raise Conflict(f"task {task_id} is claimed on controller {task.claim_host}'s slot {slot}")
    if phase.needs == "head" and not task.head_commit:
        raise Conflict(f"task {task_id} has no implemented head to publish")
    pr = publication.pr_number if publication is not None else None
    if phase.needs == "pr" and pr is None:
        raise Conflict(f"task {task_id} has no open pull request")
    return Job(env, db, phase, task, repo, str(task.state), slot=slot, pr=pr)


def _take_up(job: Job) -> FileLock | None:
    """Take the phase's lock (None: inherited from the tick) and, for a slot phase, the
    task: the claim names this process, which is how recovery tells a live job."""
    env, db, task = job.env, job.db, job.task
    if job.phase.lock != SLOT:
        return hold_task_lock(env, db, task.id, task.state, task.version)
    lock = hold_job_lock(env, f"slot-{job.slot}")
    job.token = f"{job.slot}-pid{os.getpid()}"
    try:
        with db.write() as session:
            task.version = advance(
                session,
                task.id,
                job.started,
                task.version,
                job.holds,
                f"{job.phase.doing} on slot {job.slot}",
                actor=job.phase.command,
                kind="job.started" if job.holds == job.started else "task.transition",
                follow_data_changes=True,  # the tick named this job's pid meanwhile
                claim_token=job.token,
            )
        task.state = job.holds
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def _retry(job: Job, reason: str, state: str) -> str | None:
    """STATE while the phase's budget lasts, else failed; None: the task moved meanwhile."""
    task = job.task
    name = job.phase.name
    return land_after_failure(
        job.env, job.db, task.id, job.holds, task.version, name, reason, retry_state=state
    )


def _move(job: Job, outcome: Outcome) -> tuple[str, str | None]:
    """The attempt's end and the task's last move; (the state it is in, why a refused
    move was refused)."""
    env, db, task = job.env, job.db, job.task
    if outcome.attempt is not None:
        job.finish(outcome.attempt, outcome.attempt_reason, refunded=outcome.refunded)
    release = RELEASE if job.phase.lock == SLOT else {}
    changes = {**release, **outcome.changes}
    if outcome.repair is not None:
        state = request_repair(env, db, task, job.holds, outcome.repair, outcome.reason, **changes)
    elif outcome.retry is not None:
        retried = _retry(job, outcome.reason, outcome.retry)
        if retried is None:
            refusal = Refusal(task.id, job.holds, task.version, outcome.retry, "stale")
            return _refused(job, outcome, refusal)
        state = retried
    elif outcome.state is None:
        now = job.now()
        return (str(now.state) if now is not None else "gone"), None
    else:
        with db.write() as session:
            if outcome.writes is not None:
                outcome.writes(session)
            task.version = advance(
                session,
                task.id,
                job.holds,
                task.version,
                outcome.state,
                outcome.reason[:1000],
                actor=outcome.actor or job.phase.command,
                kind=outcome.kind,
                data=outcome.data,
                follow_data_changes=not outcome.scoped,
                **changes,
            )
        state = outcome.state
    task.state = state
    if outcome.comment is not None:
        comment_on_issue(env, db, task.id, outcome.comment)
    return state, None


def _refused(job: Job, outcome: Outcome, refusal: Refusal) -> tuple[str, str | None]:
    """The task moved on while the phase ran: that decision stands and what was made is
    retained. Still claimed by this job, only its scope changed: the result answers the
    old one, so the task goes back to the phase's retry state for the new one."""
    now = job.now()
    state = str(now.state) if now is not None else "gone"
    why = f"the task became {state} while the phase ran; its result is retained"
    ours = now is not None and now.state == job.holds and now.claim_token == job.token
    if outcome.scoped and ours and job.token is not None:
        assert now is not None
        why = "the issue changed while the phase ran; its result is retained"
        job.keep(why)
        job.task.version = now.version
        again = Outcome(outcome.report, job.retry, why)
        moved, _ = _move(job, again)
        return moved, why
    if job.phase.lock != SLOT:
        # A step's move refused (the task was paused, or a new scope was recorded): the
        # step failed, as any failure of it, and its next run reads the task again.
        raise TransitionRefused(refusal)
    job.keep(why)
    log.warning("task %d: %s (%s)", job.task.id, why, refusal.sentence())
    return state, why
