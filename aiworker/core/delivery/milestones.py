"""`aiworker milestones --task ID`: move an approved plan forward, one milestone at a time.

The tick starts this step (holding task-N.lock) for a plan awaiting approval or
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
from aiworker.core.context import Environment
from aiworker.core.delivery.plan_approval import (
    Plan,
    PlanStepReport,
    approve,
    move_plan,
    pause,
)
from aiworker.core.delivery.steps import step_guard
from aiworker.core.evidence.gate import publication_allowed, run_checks
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.intake.approval import read_approval
from aiworker.core.intake.authorization import PermissionReader
from aiworker.core.intake.scope import fingerprint
from aiworker.core.runner.dispatch import Dispatch
from aiworker.core.scheduling.launcher import follow_up_if_asked
from aiworker.core.tasks.hosts import hold_task_lock
from aiworker.core.tasks.lifecycle import TransitionRefused, advance
from aiworker.core.tasks.milestones import (
    checks_of,
    plan_milestones,
    requirements_of,
    supersede_milestones,
)
from aiworker.core.tasks.notices import comment_on_issue
from aiworker.core.tasks.repairs import RepairRequest, request_repair
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import Conflict, InvalidInput
from aiworker.runtime.failpoints import failpoint
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task

STEP = "milestones"  # the attempts' phase and the budget of the combined checks
WORKING = frozenset({S.READY, S.CLAIMED, S.RUNNING, S.REPAIRING, S.PAUSED, S.NEEDS_INPUT})


def advance_plan(env: Environment, task_id: int) -> PlanStepReport:
    db = env.open_database()
    try:
        with db.read() as session:
            task = session.get(Task, task_id)
            repo = session.get(Repository, task.repository_id) if task else None
        if task is None or repo is None:
            raise InvalidInput(f"no task {task_id}")
        if task.kind != "plan" or task.state not in (S.AWAITING_PLAN_APPROVAL, S.MILESTONES):
            raise Conflict(
                f"task {task_id} is a {task.kind} task {task.state}, not a plan in progress"
            )
        lock = hold_task_lock(env, db, task.id, task.state, task.version)
        try:
            report = _step(env, db, task, repo)
        finally:
            if lock is not None:
                lock.release()
        if report.started is not None or report.state != task.state:
            follow_up_if_asked(env)
        return report
    finally:
        db.dispose()


def _step(env: Environment, db: Database, task: Task, repo: Repository) -> PlanStepReport:
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
    scope = fingerprint(issue, config.labels.approved)
    plan = Plan(task, repo, issue, timeline, approval, scope)
    report = PlanStepReport(task.id, task.state, approval=approval.reason)
    try:
        if task.state == S.AWAITING_PLAN_APPROVAL:
            if not approve(env, db, plan, report):
                return report
        elif spec.get("approved", {}).get("fingerprint") != scope or not approval.approved:
            why = (
                "the issue changed after the plan was approved"
                if spec.get("approved", {}).get("fingerprint") != scope
                else f"the approval no longer holds ({approval.reason})"
            )
            pause(env, db, plan, why, report)
            return report
        _milestones(env, db, plan, report)
    except TransitionRefused as exc:
        # A task moved meanwhile (paused, cancelled, a milestone's job): the next step
        # decides again from what is recorded then.
        report.reason = exc.message
    return report


def _milestones(env: Environment, db: Database, plan: Plan, report: PlanStepReport) -> None:
    task = plan.task
    for child in plan_milestones(db, task):
        if child.state in (S.FAILED, S.CANCELLED):
            reason = f"milestone {child.id} ({child.title}) is {child.state}"
            if move_plan(db, task, S.MILESTONES, S.FAILED, reason, report):
                supersede_milestones(db, task.id)  # nothing of a failed plan starts later
                comment_on_issue(env, db, task.id, f"aiworker stopped this plan: {reason}.")
            return
        if child.state == S.IMPLEMENTED:
            if not _accept(db, task, child, report):
                return
            failpoint("milestones.after_accept")
        elif child.state in WORKING:
            report.reason = f"milestone {child.id} is {child.state}"
            return
        elif child.state == S.NEW:
            start = task.head_commit or task.base_commit or ""
            with db.write() as session:
                advance(
                    session,
                    child.id,
                    S.NEW,
                    child.version,
                    S.READY,
                    f"next milestone of plan {task.id}; it starts from {start[:12]}",
                    kind="milestone.started",
                )
            report.started = child.id
            return
    _finish(env, db, plan, report)


def _accept(db: Database, task: Task, child: Task, report: PlanStepReport) -> bool:
    """Take an implemented milestone into the plan: its receipts must hold at its head."""
    assert child.head_commit is not None
    assert child.base_commit is not None
    allowed, why = publication_allowed(
        db,
        child.id,
        head=child.head_commit,
        base=child.base_commit,
        scope=child.scope_fingerprint,
        requirements=requirements_of(child, ""),
    )
    with db.write() as session:
        if not allowed:
            advance(
                session,
                child.id,
                S.IMPLEMENTED,
                child.version,
                S.FAILED,
                why,
                kind="milestone.refused",
            )
            return False
        advance(
            session,
            child.id,
            S.IMPLEMENTED,
            child.version,
            S.DONE,
            f"accepted into plan {task.id} at {child.head_commit[:12]}",
            kind="milestone.accepted",
            data={"head": child.head_commit},
        )
        task.version = advance(
            session,
            task.id,
            S.MILESTONES,
            task.version,
            S.MILESTONES,
            f"milestone {child.id} accepted; the plan's head is {child.head_commit[:12]}",
            kind="plan.milestone_accepted",
            data={"milestone": child.id, "head": child.head_commit},
            head_commit=child.head_commit,
        )
    task.head_commit = child.head_commit
    child.state = S.DONE
    report.accepted.append(child.id)
    return True


def _finish(env: Environment, db: Database, plan: Plan, report: PlanStepReport) -> None:
    """Every milestone is in: the combined checks at the final head decide. They run as a
    guarded step (an attempt each, charged to the plan's `milestones` budget): a run that
    fails or dies is retried within the budget, then the plan fails with a comment."""
    task, repo = plan.task, plan.repo
    head, base = task.head_commit, task.base_commit
    assert head is not None
    assert base is not None
    with step_guard(env, db, task, STEP, {"head": head}) as guard:
        gate = run_checks(
            db,
            Dispatch.of(env, db),
            index=repo.index,
            head=head,
            base=base,
            task_id=task.id,
            scope=task.scope_fingerprint,
            requirements=checks_of(db, task, plan.issue.body),
        )
        failpoint("milestones.after_checks")
        failed = gate.failures()
        guard.finish("failed" if failed else "succeeded", "; ".join(failed)[:500])
        if failed:
            request = RepairRequest(
                "checks", head, base, [Finding(severity="blocker", message=f) for f in failed]
            )
            report.state = request_repair(env, db, task, S.MILESTONES, request, "; ".join(failed))
            return
        reason = f"every milestone is in; the combined checks passed at {head[:12]}"
        move_plan(db, task, S.MILESTONES, S.IMPLEMENTED, reason, report, base_commit=base)
