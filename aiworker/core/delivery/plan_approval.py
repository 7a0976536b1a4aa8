"""A plan's approval: starting an approved plan (its milestones created once, in order),
and pausing a running one whose scope changed or whose approval was withdrawn
(core/delivery/milestones.py reads the approval and decides)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiworker.adapters.forgejo.models import Issue, TimelineComment
from aiworker.contracts.agent import MilestoneSpec
from aiworker.core.context import Environment
from aiworker.core.intake.approval import Approval, last_item
from aiworker.core.report import Report
from aiworker.core.tasks.lifecycle import TransitionRefused, advance
from aiworker.core.tasks.notices import comment_on_issue
from aiworker.core.tasks.states import TaskState as S
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task
from aiworker.store.task_records import children_of, create_task


@dataclass
class PlanStepReport(Report):
    task: int
    state: str
    approval: str = ""
    accepted: list[int] = field(default_factory=list)
    started: int | None = None  # the milestone made ready
    reason: str = ""


@dataclass
class Plan:
    task: Task
    repo: Repository
    issue: Issue
    timeline: list[TimelineComment]
    approval: Approval
    scope: str  # the issue's requirements fingerprint, read now


def approve(env: Environment, db: Database, plan: Plan, report: PlanStepReport) -> bool:
    """Start an approved plan (creating its milestones once); False when it waits."""
    task = plan.task
    spec = dict(task.spec or {})
    children_made = bool(spec.get("children"))
    if spec.get("fingerprint") != plan.scope and not children_made:
        reason = "the issue changed after the plan was posted; planning again"
        move_plan(db, task, S.AWAITING_PLAN_APPROVAL, S.READY, reason, report, spec=None)
        return False
    if spec.get("fingerprint") != plan.scope:
        # Changed while it waited: an approval given before this was seen may have been for
        # the earlier scope, so only one given from now on counts.
        spec["fingerprint"], spec["approval_after"] = plan.scope, last_item(plan.timeline)
        why = "the issue changed while the plan awaited approval; a writer must approve again"
        move_plan(
            db, task, S.AWAITING_PLAN_APPROVAL, S.AWAITING_PLAN_APPROVAL, why, report, spec=spec
        )
        return False
    if not plan.approval.approved:
        report.reason = "waiting for a writer's approval"
        return False
    milestones = [MilestoneSpec.model_validate(m) for m in spec["milestones"]]
    spec["approved"] = {
        "by": plan.approval.actor,
        "item": plan.approval.item,
        "fingerprint": plan.scope,
    }
    with db.write() as session:
        for child in children_of(session, task.id):
            if child.state == S.NEEDS_INPUT and child.id in spec.get("children", []):
                # The issue changed for it (the plan was approved again for the new scope).
                advance(session, child.id, S.NEEDS_INPUT, child.version, S.READY, "approved again")
        if not children_made:
            spec["children"] = [
                create_task(
                    session,
                    task.repository_id,
                    "milestone",
                    title=m.title[:200],
                    state=S.NEW,
                    parent_id=task.id,
                    scope_fingerprint=plan.scope,
                    spec={"milestone": m.model_dump(), "position": n, "total": len(milestones)},
                ).id
                for n, m in enumerate(milestones, 1)
            ]
        task.version = advance(
            session,
            task.id,
            S.AWAITING_PLAN_APPROVAL,
            task.version,
            S.MILESTONES,
            f"plan approved: {plan.approval.reason}",
            actor=plan.approval.actor,
            kind="plan.approved",
            data={"approval": spec["approved"]},
            spec=spec,
        )
    task.state, task.spec = S.MILESTONES, spec
    report.state = S.MILESTONES
    comment_on_issue(
        env,
        db,
        task.id,
        f"The plan was approved ({plan.approval.reason}); its {len(milestones)} milestones "
        "run one at a time on one branch.",
    )
    return True


def pause(env: Environment, db: Database, plan: Plan, why: str, report: PlanStepReport) -> None:
    """Back to awaiting approval: nothing new starts until a writer approves again."""
    task = plan.task
    spec = dict(task.spec or {})
    spec.pop("approved", None)
    spec["fingerprint"], spec["approval_after"] = plan.scope, last_item(plan.timeline)
    with db.write() as session:
        for child in children_of(session, task.id):
            if child.state == S.READY:
                advance(
                    session, child.id, S.READY, child.version, S.NEW, why, kind="milestone.held"
                )
    if move_plan(db, task, S.MILESTONES, S.AWAITING_PLAN_APPROVAL, why, report, spec=spec):
        label, command = (
            env.loaded.config.labels.approved,
            env.loaded.config.planning.approve_command,
        )
        comment_on_issue(
            env,
            db,
            task.id,
            f"The plan is paused: {why}. A user with write permission approves it again by "
            f"applying `{label}` (remove it first if it is still there) or commenting `{command}`.",
        )


def move_plan(
    db: Database,
    task: Task,
    from_state: str,
    to_state: str,
    reason: str,
    report: PlanStepReport,
    **changes: Any,
) -> bool:
    try:
        with db.write() as session:
            task.version = advance(
                session,
                task.id,
                from_state,
                task.version,
                to_state,
                reason,
                actor="plan",
                **changes,
            )
    except TransitionRefused as exc:
        report.reason = exc.message
        return False
    report.state, report.reason = to_state, reason
    return True
