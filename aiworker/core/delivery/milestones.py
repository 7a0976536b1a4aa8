"""`aiworker milestones --task ID`: move an approved plan forward, one milestone at a time.

The tick starts this step (the driver holds task-N.lock) for a plan awaiting approval or
running its milestones. It reads the issue's timeline each time:
- awaiting approval: a writer's approval (intake/approval.py) after the plan was
  posted creates the milestone tasks (waiting, in order) and starts the plan; a plan
  whose issue changed before anyone approved it is planned again;
- running: the approval is re-verified and the scope compared with the approved one
  before anything starts (a changed scope or a withdrawn approval pauses the plan
  until it is approved again); an implemented milestone whose receipts hold at its
  head is accepted and its head becomes the plan's; the next milestone is made ready
  (it starts from that head); a failed milestone fails the plan with a comment; when
  every milestone is in, the plan's combined checks (the issue's and every
  milestone's) run at the final head, and the plan is implemented: publish opens its
  one PR, reviewed and merged like an issue. Failing combined checks start a repair.
"""

from __future__ import annotations

from aiworker.contracts.agent import Finding
from aiworker.core.delivery.plan_approval import Plan, PlanStepReport, approve, pause
from aiworker.core.evidence.authorisation import checked_at_head
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.intake.approval import read_approval
from aiworker.core.intake.authorization import PermissionReader
from aiworker.core.intake.scope import fingerprint
from aiworker.core.phases.at_head import gate_at
from aiworker.core.phases.job import Job
from aiworker.core.phases.outcome import Outcome
from aiworker.core.tasks.milestones import (
    accept_milestone,
    cancel_milestones,
    checks_of,
    plan_milestones,
    requirements_of,
    start_milestone,
)
from aiworker.core.tasks.repairs import RepairRequest
from aiworker.core.tasks.states import TaskState as S
from aiworker.runtime.failpoints import failpoint

WORKING = frozenset({S.READY, S.CLAIMED, S.RUNNING, S.REPAIRING, S.PAUSED, S.NEEDS_INPUT})


def milestones(job: Job) -> Outcome:
    env, task, repo = job.env, job.task, job.repo
    report = PlanStepReport(task.id, task.state)
    job.report = report
    config = env.loaded.config
    access = ForgeAccess(env.loaded)
    worker = access.required("worker")
    issue = worker.issue(repo.owner, repo.name, task.issue_number or 0)
    timeline = worker.timeline(repo.owner, repo.name, issue.number)
    spec = dict(task.spec or {})
    approval = read_approval(
        timeline,
        PermissionReader(access.optional("operator"), access.bots()),
        repo.owner,
        repo.name,
        label=config.labels.approved,
        command=config.planning.approve_command,
        after=int(spec.get("approval_after", 0)),
    )
    report.approval = approval.reason
    scope = fingerprint(issue, config.labels.approved)
    plan = Plan(task, repo, issue, timeline, approval, scope)
    if task.state == S.AWAITING_PLAN_APPROVAL:
        waits = approve(job, plan, report)
        if waits is not None:
            return waits
    elif spec.get("approved", {}).get("fingerprint") != scope or not approval.approved:
        why = (
            "the issue changed after the plan was approved"
            if spec.get("approved", {}).get("fingerprint") != scope
            else f"the approval no longer holds ({approval.reason})"
        )
        report.reason = why
        return pause(env, task, scope, timeline, why, report)
    return _milestones(job, plan, report)


def _milestones(job: Job, plan: Plan, report: PlanStepReport) -> Outcome:
    """Accept what is implemented and start the next milestone; once all are in, the
    combined checks decide."""
    db, task = job.db, plan.task
    moved = task.state != job.started
    for child in plan_milestones(db, task):
        if child.state in (S.FAILED, S.CANCELLED):
            reason = f"milestone {child.id} ({child.title}) is {child.state}"
            report.reason = reason
            return Outcome(
                report,
                S.FAILED,
                reason,
                actor="plan",
                scoped=True,
                # Nothing of a failed plan starts later.
                writes=lambda session: cancel_milestones(session, task.id),
                comment=f"aiworker stopped this plan: {reason}.",
            )
        if child.state == S.IMPLEMENTED:
            assert child.head_commit is not None
            assert child.base_commit is not None
            allowed, why = checked_at_head(db, child, requirements_of(child, ""))
            accept_milestone(db, task, child, None if allowed else why)
            if not allowed:
                return Outcome(report, follow_up=True)
            report.accepted.append(child.id)
            moved = True
            failpoint("milestones.after_accept")
        elif child.state in WORKING:
            report.reason = f"milestone {child.id} is {child.state}"
            return Outcome(report, follow_up=moved)
        elif child.state == S.NEW:
            start_milestone(db, task, child)
            report.started = child.id
            return Outcome(report)
    return _finish(job, plan, report)


def _finish(job: Job, plan: Plan, report: PlanStepReport) -> Outcome:
    """Every milestone is in: the combined checks at the final head decide, as an attempt
    of this step (charged to the plan's `milestones` budget): a run that fails or dies is
    retried within the budget, then the plan fails with a comment."""
    db, task = job.db, plan.task
    head, base = task.head_commit, task.base_commit
    assert head is not None
    assert base is not None
    job.start(None, {"head": head})
    gate = gate_at(job, head, base, checks_of(db, task, plan.issue.body))
    failpoint("milestones.after_checks")
    failed = gate.failures()
    if failed:
        request = RepairRequest(
            "checks", head, base, [Finding(severity="blocker", message=f) for f in failed]
        )
        landing = Outcome(report, repair=request, reason="; ".join(failed))
        return landing.ended("failed", "; ".join(failed)[:500])
    reason = f"every milestone is in; the combined checks passed at {head[:12]}"
    report.reason = reason
    changes = {"base_commit": base}
    landing = Outcome(report, S.IMPLEMENTED, reason, changes, actor="plan", scoped=True)
    return landing.ended("succeeded")
