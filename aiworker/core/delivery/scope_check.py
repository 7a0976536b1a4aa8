"""What a person changed on the issue after the work was done, as publish and merge meet
it: a scope that moved sends the task to a repair episode (a plan back to awaiting a
writer's approval), and an authorisation taken back pauses it; never on to publication
or merge with work done for requirements that no longer stand, or no longer asked for."""

from __future__ import annotations

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.models import Issue
from aiworker.contracts.agent import Finding
from aiworker.core.delivery.plan_approval import pause
from aiworker.core.evidence.authorisation import PHASE as VALIDATION
from aiworker.core.intake.authorization import Decision
from aiworker.core.intake.scope import fingerprint
from aiworker.core.phases.job import Job
from aiworker.core.phases.outcome import Outcome
from aiworker.core.report import Report
from aiworker.core.tasks.repairs import RepairRequest
from aiworker.core.tasks.states import TaskState as S
from aiworker.store.receipts import receipts_for

REPAIRABLE = ("issue", "feature")


def answer_moved_scope(
    job: Job, worker: ForgejoClient, issue: Issue, report: Report
) -> Outcome | None:
    """When ISSUE's requirements are no longer those the work at the task's head was checked
    for, the step ends with a repair (cause `scope`) and the new scope recorded, or sends a
    plan back to await approval (read with WORKER; delivery/plan_approval.py then wants a
    new one); None when the scope stands."""
    env, db, task = job.env, job.db, job.task
    scope = fingerprint(issue, env.loaded.config.labels.approved)
    if task.kind == "plan":
        return _plan_approved_for(job, worker, issue, scope, report)
    if task.kind not in REPAIRABLE or not task.head_commit or not task.base_commit:
        return None
    with db.read() as session:
        checked_for = {
            r.scope_fingerprint
            for r in receipts_for(session, task.id, VALIDATION)
            if r.head_commit == task.head_commit
        }
    if scope == task.scope_fingerprint and (not checked_for or scope in checked_for):
        return None
    why = "the issue's requirements changed after the work was done"
    finding = Finding(
        severity="blocker",
        message=f"{why}: make the work meet the request as it reads now (the issue's text)",
    )
    request = RepairRequest("scope", task.head_commit, task.base_commit, [finding])
    return Outcome(report, repair=request, reason=why, changes={"scope_fingerprint": scope})


def _plan_approved_for(
    job: Job, worker: ForgejoClient, issue: Issue, scope: str, report: Report
) -> Outcome | None:
    approved = (job.task.spec or {}).get("approved", {}).get("fingerprint")
    if approved is None or approved == scope:
        return None
    # Approved again only by a writer who saw the change: after the timeline as it is now.
    timeline = worker.timeline(job.repo.owner, job.repo.name, issue.number)
    why = "the issue changed after the plan was approved"
    return pause(job.env, job.task, scope, timeline, why, report, actor=job.phase.command)


def paused_if_withdrawn(decision: Decision, report: Report) -> Outcome | None:
    """When the work's authorisation no longer holds (the assignment or label removed, the
    writer who gave it no longer one, a text only its author vouches for), the task is
    paused as poll pauses it, and taken back when a writer authorises it again; None when
    it holds."""
    if decision.authorized:
        return None
    why = f"authorisation no longer holds: {decision.reason}"
    return Outcome(report, S.PAUSED, why, kind="task.paused", follow_up=False)
