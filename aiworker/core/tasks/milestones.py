"""Plans and their milestones: what the host accepts from a planning result, the plan as
it is posted on the issue, and the checks each milestone (and the whole plan) must pass.

A plan task's `spec` holds its proposed milestones, the scope fingerprint they answer,
the plan comment and, once a writer approved it, who and for which fingerprint. A
milestone task's `spec` holds its own milestone (title, scope, acceptance criteria,
validation checks, the simple flag) and its position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiworker.contracts.agent import MilestoneSpec
from aiworker.contracts.runner import ENTRYPOINT_SELECTOR
from aiworker.core.evidence.measurements import Threshold
from aiworker.core.evidence.requirements import (
    Requirement,
    default_requirements,
    requirements_from_issue,
)
from aiworker.core.tasks.budgets import RELEASE
from aiworker.core.tasks.lifecycle import advance
from aiworker.core.tasks.states import TERMINAL, TaskState, allowed
from aiworker.store.engine import Database
from aiworker.store.models import Task
from aiworker.store.task_records import children_of, create_task

PLAN_MARK = "<!-- aiworker:plan task={task} -->"


def plan_problems(milestones: Sequence[MilestoneSpec], limit: int) -> list[str]:
    """Why the host does not accept these milestones as a plan; empty when it does."""
    problems = []
    if not milestones:
        problems.append("the plan proposes no milestones")
    if len(milestones) > limit:
        problems.append(f"the plan proposes {len(milestones)} milestones; at most {limit}")
    for number, milestone in enumerate(milestones, 1):
        ids = [check.check_id for check in milestone.validation]
        if len(set(ids)) != len(ids):
            problems.append(f"milestone {number}: each check id may appear once")
        for check in milestone.validation:
            if check.command[0] != ENTRYPOINT_SELECTOR:
                problems.append(
                    f"milestone {number}: check {check.check_id} must run {ENTRYPOINT_SELECTOR}"
                )
    return problems


def plan_comment(
    task_id: int, milestones: Sequence[MilestoneSpec], label: str, command: str
) -> str:
    lines = [f"aiworker proposes this plan in {len(milestones)} milestones:", ""]
    for number, milestone in enumerate(milestones, 1):
        simple = " (simple)" if milestone.simple else ""
        lines.append(f"### {number}. {milestone.title}{simple}")
        lines.append(milestone.scope)
        lines += [f"- [ ] {criterion}" for criterion in milestone.acceptance_criteria]
        for check in milestone.validation:
            lines.append(f"- check `{check.check_id}`: `{' '.join(check.command)}`")
        lines.append("")
    lines.append(
        f"Nothing runs until a user with write permission approves: apply the `{label}` "
        f"label or comment `{command}`. Editing the issue afterwards pauses the plan until "
        "it is approved again."
    )
    lines.append(PLAN_MARK.format(task=task_id))
    return "\n".join(lines)


def milestone_of(task: Task) -> MilestoneSpec:
    spec = task.spec or {}
    return MilestoneSpec.model_validate(spec["milestone"])


def requirements_of(task: Task, issue_body: str) -> list[Requirement]:
    """The checks TASK must pass: a milestone's own (or ./ci/run), else the issue's."""
    if task.kind != "milestone":
        return requirements_from_issue(issue_body)
    checks = milestone_of(task).validation
    return [
        Requirement(
            c.check_id,
            tuple(c.command),
            thresholds=tuple(Threshold(**t.model_dump()) for t in c.thresholds),
        )
        for c in checks
    ] or default_requirements()


def combined_requirements(children: Sequence[Task], issue_body: str) -> list[Requirement]:
    """The whole plan's checks: the issue's and every milestone's, each once. A milestone
    check whose id another command already uses is kept under `mN.ID`."""
    found: dict[str, Requirement] = {r.check_id: r for r in requirements_from_issue(issue_body)}
    for number, child in enumerate(children, 1):
        for requirement in requirements_of(child, ""):
            known = found.get(requirement.check_id)
            if known is None:
                found[requirement.check_id] = requirement
            elif known.argv != requirement.argv:
                renamed = f"m{number}.{requirement.check_id}"[:64]
                found[renamed] = Requirement(renamed, requirement.argv)
    return list(found.values())


def plan_milestones(db: Database, plan: Task) -> list[Task]:
    """The milestones of PLAN's approved plan, in order (an earlier, superseded plan's are
    not among them)."""
    ids = [int(i) for i in (plan.spec or {}).get("children", [])]
    with db.read() as session:
        found = {child.id: child for child in children_of(session, plan.id)}
    return [found[i] for i in ids if i in found]


def checks_of(db: Database, task: Task, issue_body: str) -> list[Requirement]:
    """Every check TASK's work must pass wherever it is checked (gate, repair, base refresh,
    publication, merge): a plan's combined checks, a milestone's own, else the issue's."""
    if task.kind == "plan":
        return combined_requirements(plan_milestones(db, task), issue_body)
    return requirements_of(task, issue_body)


def supersede_milestones(db: Database, plan_id: int) -> None:
    """A new plan replaces the old one, or the plan failed: its milestones that have not
    ended are cancelled."""
    with db.write() as session:
        cancel_milestones(session, plan_id)


def cancel_milestones(session: Any, plan_id: int) -> None:
    """supersede_milestones inside the caller's transaction."""
    for child in children_of(session, plan_id):
        if child.state not in TERMINAL and allowed(child.state, TaskState.CANCELLED):
            advance(
                session,
                child.id,
                child.state,
                child.version,
                TaskState.CANCELLED,
                "superseded by a new plan",
                kind="milestone.superseded",
                **RELEASE,
            )


def approve_plan(
    db: Database,
    plan: Task,
    spec: dict[str, Any],
    milestones: Sequence[MilestoneSpec],
    scope: str,
    actor: str | None,
    why: str,
) -> None:
    """Start an approved PLAN: its milestones are created once, waiting in order (one that
    waited for the issue to change is ready again), and the plan runs them. PLAN follows
    the move."""
    with db.write() as session:
        made = spec.get("children") or []
        for child in children_of(session, plan.id):
            if child.state == TaskState.NEEDS_INPUT and child.id in made:
                # The issue changed for it (the plan was approved again for the new scope).
                advance(
                    session,
                    child.id,
                    TaskState.NEEDS_INPUT,
                    child.version,
                    TaskState.READY,
                    "approved again",
                )
        if not made:
            spec["children"] = [
                create_task(
                    session,
                    plan.repository_id,
                    "milestone",
                    title=m.title[:200],
                    state=TaskState.NEW,
                    parent_id=plan.id,
                    scope_fingerprint=scope,
                    spec={"milestone": m.model_dump(), "position": n, "total": len(milestones)},
                ).id
                for n, m in enumerate(milestones, 1)
            ]
        plan.version = advance(
            session,
            plan.id,
            TaskState.AWAITING_PLAN_APPROVAL,
            plan.version,
            TaskState.MILESTONES,
            why,
            actor=actor,
            kind="plan.approved",
            data={"approval": spec["approved"]},
            spec=spec,
        )
    plan.state, plan.spec = TaskState.MILESTONES, spec


def hold_milestones(session: Any, plan_id: int, why: str) -> None:
    """The plan is paused: its milestone waiting to start waits for the next approval."""
    for child in children_of(session, plan_id):
        if child.state == TaskState.READY:
            advance(
                session,
                child.id,
                TaskState.READY,
                child.version,
                TaskState.NEW,
                why,
                kind="milestone.held",
            )


def start_milestone(db: Database, plan: Task, child: Task) -> None:
    """CHILD is the plan's next milestone: ready, starting from the plan's head."""
    start = plan.head_commit or plan.base_commit or ""
    with db.write() as session:
        advance(
            session,
            child.id,
            TaskState.NEW,
            child.version,
            TaskState.READY,
            f"next milestone of plan {plan.id}; it starts from {start[:12]}",
            kind="milestone.started",
        )


def accept_milestone(db: Database, plan: Task, child: Task, refusal: str | None) -> None:
    """Take an implemented milestone into PLAN (its head becomes the plan's), or fail it
    with REFUSAL when its receipts do not hold at its head. PLAN and CHILD follow."""
    assert child.head_commit is not None
    with db.write() as session:
        if refusal is not None:
            advance(
                session,
                child.id,
                TaskState.IMPLEMENTED,
                child.version,
                TaskState.FAILED,
                refusal,
                kind="milestone.refused",
            )
            child.state = TaskState.FAILED
            return
        advance(
            session,
            child.id,
            TaskState.IMPLEMENTED,
            child.version,
            TaskState.DONE,
            f"accepted into plan {plan.id} at {child.head_commit[:12]}",
            kind="milestone.accepted",
            data={"head": child.head_commit},
        )
        plan.version = advance(
            session,
            plan.id,
            TaskState.MILESTONES,
            plan.version,
            TaskState.MILESTONES,
            f"milestone {child.id} accepted; the plan's head is {child.head_commit[:12]}",
            kind="plan.milestone_accepted",
            data={"milestone": child.id, "head": child.head_commit},
            head_commit=child.head_commit,
        )
    plan.head_commit = child.head_commit
    child.state = TaskState.DONE


def accepted_milestones(db: Database, plan: Task) -> str:
    """The plan's milestones as its PR names them: each one's head, on which its own checks
    passed (empty for a task that is not a plan)."""
    children = plan_milestones(db, plan) if plan.kind == "plan" else []
    lines = [
        f"{n}. {milestone_of(c).title}: accepted at {c.head_commit} on {c.base_commit}"
        for n, c in enumerate(children, 1)
    ]
    return "Milestones, each checked at its own head:\n" + "\n".join(lines) if lines else ""
