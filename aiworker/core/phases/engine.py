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

from aiworker import logs
from aiworker.core.context import JOB_OUTAGE_WAIT_S, Environment
from aiworker.core.guests.backends import backend_for
from aiworker.core.phases.job import Job
from aiworker.core.phases.outcome import Outcome
from aiworker.core.phases.table import SLOT, TASK, Phase
from aiworker.core.tasks.budgets import RELEASE, budget_spent
from aiworker.core.tasks.claim_jobs import claim_token, take_up
from aiworker.core.tasks.hosts import hold_task_lock
from aiworker.core.tasks.lifecycle import Refusal, TransitionRefused, advance
from aiworker.core.tasks.notices import comment_on_issue
from aiworker.core.tasks.recovery import recover_task
from aiworker.core.tasks.repairs import request_repair
from aiworker.errors import Conflict
from aiworker.runtime.failpoints import failpoint
from aiworker.store.engine import Database
from aiworker.store.models import Repository
from aiworker.store.publications import current_publication
from aiworker.store.task_records import existing_task

log = logging.getLogger(__name__)


class BudgetSpent(Conflict):
    code = "budget_spent"


def run_phase(env: Environment, phase: Phase, task_id: int, slot: int | None = None) -> Outcome:
    """Run PHASE for TASK_ID (on SLOT, for a slot phase); the Outcome it ended with."""
    db = env.open_database(patience=JOB_OUTAGE_WAIT_S)  # a database restart costs no work
    try:
        job = _load(env, db, phase, task_id, slot)
        _take_up(job)
        exhausted = budget_spent(env, db, task_id, phase.name)
        if exhausted:
            with job.held:  # the lock goes once the task landed
                job.land(exhausted)
            raise BudgetSpent(f"task {task_id}: the {phase.name} budget is spent")
        job.backend = backend_for(env, phase.name) if phase.backend else None
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
            outcome.report.landed(state, refusal)
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
    on_slot = phase.lock == SLOT
    if task.state not in phase.starts or (on_slot and task.claim_slot != slot):
        where = f" on slot {task.claim_slot}" if on_slot and task.claim_slot else ""
        wanted = " or ".join(sorted(phase.starts)) + (f" on slot {slot}" if on_slot else "")
        raise Conflict(f"task {task_id} is {task.state}{where}, not {wanted}")
    if task.kind not in phase.kinds:
        raise Conflict(f"task {task_id} is a {task.kind} task; {phase.command} is not for it")
    if on_slot and task.claim_host not in (None, db.host):
        raise Conflict(f"task {task_id} is claimed on controller {task.claim_host}'s slot {slot}")
    if phase.needs == "head" and not task.head_commit:
        raise Conflict(f"task {task_id} has no implemented head to publish")
    pr = publication.pr_number if publication is not None else None
    if phase.needs == "pr" and pr is None:
        raise Conflict(f"task {task_id} has no open pull request")
    return Job(env, db, phase, task, repo, str(task.state), slot=slot, pr=pr)


def _take_up(job: Job) -> None:
    """Take the phase's lock (none when the tick's is inherited) and, for a slot phase,
    the task."""
    env, db, task, phase = job.env, job.db, job.task, job.phase
    if phase.lock == SLOT:
        assert job.slot is not None
        job.token = claim_token(job.slot)
        why = f"{phase.doing} on slot {job.slot}"
        lock = take_up(env, db, task, job.slot, job.holds, why, phase.command)
    else:
        lock = hold_task_lock(env, db, task.id, task.state, task.version)
    if lock is not None:
        job.held.callback(lock.release)
    if phase.lock == TASK:  # held: an attempt of the task still open here died
        recover_task(env, db, task.id)


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
        retried = job.land(outcome.reason, outcome.retry)
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
