"""A plan's approval: starting an approved plan (its milestones created once, in order),
and pausing a running one whose scope changed or whose approval was withdrawn
(core/delivery/milestones.py reads the approval and decides)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiworker.adapters.forgejo.models import Issue, TimelineComment
from aiworker.contracts.agent import MilestoneSpec
from aiworker.core.context import Environment
from aiworker.core.intake.approval import Approval, last_item
from aiworker.core.phases.job import Job
from aiworker.core.phases.outcome import Outcome
from aiworker.core.report import Report
from aiworker.core.tasks.milestones import approve_plan, hold_milestones
from aiworker.core.tasks.notices import comment_on_issue
from aiworker.core.tasks.states import TaskState as S
from aiworker.store.models import Repository, Task


@dataclass
class PlanStepReport(Report):
    task: int
    state: str
    approval: str = ""
    accepted: list[int] = field(default_factory=list)
    started: int | None = None  # the milestone made ready
    reason: str = ""

    def landed(self, state: str, refusal: str | None) -> None:
        self.state = state
        if refusal is not None:
            self.reason = refusal


@dataclass
class Plan:
    task: Task
    repo: Repository
    issue: Issue
    timeline: list[TimelineComment]
    approval: Approval
    scope: str  # the issue's requirements fingerprint, read now


def approve(job: Job, plan: Plan, report: PlanStepReport) -> Outcome | None:
    """Start an approved plan (creating its milestones once): None once it runs, else how
    the step ends (it waits, or plans again)."""
    task = plan.task
    spec = dict(task.spec or {})
    children_made = bool(spec.get("children"))
    if spec.get("fingerprint") != plan.scope and not children_made:
        reason = "the issue changed after the plan was posted; planning again"
        report.reason = reason
        return Outcome(report, S.READY, reason, {"spec": None}, actor="plan", scoped=True)
    if spec.get("fingerprint") != plan.scope:
        # Changed while it waited: an approval given before this was seen may have been for
        # the earlier scope, so only one given from now on counts.
        spec["fingerprint"], spec["approval_after"] = plan.scope, last_item(plan.timeline)
        why = "the issue changed while the plan awaited approval; a writer must approve again"
        report.reason = why
        spec_now = {"spec": spec}
        return Outcome(report, S.AWAITING_PLAN_APPROVAL, why, spec_now, actor="plan", scoped=True)
    if not plan.approval.approved:
        report.reason = "waiting for a writer's approval"
        return Outcome(report, follow_up=False)
    milestones = [MilestoneSpec.model_validate(m) for m in spec["milestones"]]
    spec["approved"] = {
        "by": plan.approval.actor,
        "item": plan.approval.item,
        "fingerprint": plan.scope,
    }
    why = f"plan approved: {plan.approval.reason}"
    approve_plan(job.db, task, spec, milestones, plan.scope, plan.approval.actor, why)
    report.state = S.MILESTONES
    comment_on_issue(
        job.env,
        job.db,
        task.id,
        f"The plan was approved ({plan.approval.reason}); its {len(milestones)} milestones "
        "run one at a time on one branch.",
    )
    return None


def pause(
    env: Environment,
    task: Task,
    scope: str,
    timeline: list[TimelineComment],
    why: str,
    report: Report,
    actor: str = "plan",
) -> Outcome:
    """Back to awaiting approval for SCOPE, the issue's requirements as TIMELINE shows them
    now: nothing new starts until a writer approves again, and only an approval given
    after what TIMELINE holds counts. Said on the issue."""
    spec = dict(task.spec or {})
    spec.pop("approved", None)
    spec["fingerprint"], spec["approval_after"] = scope, last_item(timeline)
    label, command = env.loaded.config.labels.approved, env.loaded.config.planning.approve_command
    return Outcome(
        report,
        S.AWAITING_PLAN_APPROVAL,
        why,
        {"spec": spec},
        actor=actor,
        scoped=True,
        writes=lambda session: hold_milestones(session, task.id, why),
        comment=(
            f"The plan is paused: {why}. A user with write permission approves it again by "
            f"applying `{label}` (remove it first if it is still there) or commenting `{command}`."
        ),
    )
