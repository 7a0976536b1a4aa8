"""`aiworker plan --task ID --slot N`: the planner proposes milestones for a plan issue.

The planning phase runs with its own provider settings (never the simple-only local
route) in a workspace at the pinned base, whose commits are ignored. Its result
must carry bounded milestones (contracts/agent.py MilestoneSpec; at most
planning.max_milestones, checks that run ./ci/run); the host validates them and the
planner identity posts the plan on the issue. The task then awaits approval
(intake/approval.py; core/delivery/milestones.py acts on it). An invalid plan or a
failed run is retried within the planning budget; questions move the task to
needs_input with the questions commented.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from aiworker.adapters.forgejo.models import Issue
from aiworker.contracts.agent import AgentResult, MilestoneSpec
from aiworker.core.context import Environment
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.guests.backends import backend_for
from aiworker.core.intake.scope import fingerprint
from aiworker.core.intake.standing import withdrawn_at_claim
from aiworker.core.phases.continuation import continuation_json
from aiworker.core.phases.engine import admit, run_model_phase, workspaces_dir
from aiworker.core.phases.guard import PhaseGuard
from aiworker.core.phases.implement_outcomes import ImplementReport
from aiworker.core.phases.plan_decisions import (
    pending_plan,
    plan_marker,
    posted_plan,
    record_plan,
)
from aiworker.core.phases.prompts import plan_prompt
from aiworker.core.phases.slot_start import load_on_slot, take_up
from aiworker.core.scheduling.launcher import follow_up_if_asked
from aiworker.core.tasks.budgets import RELEASE, budget_spent, land_after_failure
from aiworker.core.tasks.lifecycle import TransitionRefused, advance
from aiworker.core.tasks.milestones import plan_comment, plan_problems, supersede_milestones
from aiworker.core.tasks.notices import comment_on_issue
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import EXIT_OK
from aiworker.runtime.failpoints import failpoint
from aiworker.runtime.gitcache import GitCache
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task

PHASE = "planning"


@dataclass
class PlanReport(ImplementReport):
    milestones: int = 0  # how many the posted plan proposes

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.outcome == "planned" else super().exit_code


def plan(env: Environment, task_id: int, slot: int) -> ImplementReport:
    db = env.open_database()
    try:
        task, repo = load_on_slot(db, task_id, slot, S.CLAIMED, "a claimed plan", kind="plan")
        started = take_up(env, db, task, repo, slot, S.PLANNING, f"planning on slot {slot}", PHASE)
        lock, task.version = started.lock, started.version
        report = PlanReport(task.id, "running")

        def recover(reason: str) -> None:
            landed = land_after_failure(
                env, db, task.id, S.PLANNING, task.version, PHASE, reason, retry_state=S.READY
            )
            report.state = landed or "unchanged"

        with PhaseGuard(db, task.id, PHASE, recover, backend_for(env, PHASE), lock) as guard:
            _plan(env, db, guard, task, repo, slot, report)
        if report.outcome != "unavailable":
            follow_up_if_asked(env)
        return report
    finally:
        db.dispose()


def _plan(
    env: Environment,
    db: Database,
    guard: PhaseGuard,
    task: Task,
    repo: Repository,
    slot: int,
    report: PlanReport,
) -> None:
    config = env.loaded.config
    access = ForgeAccess(env.loaded)
    planner = access.required("planner")
    issue = planner.issue(repo.owner, repo.name, task.issue_number or 0)
    forge_repo = planner.repository(repo.owner, repo.name)
    cache = GitCache(env.state_dir)
    cache.fetch(repo.index, forge_repo.clone_url, access.token("planner"))
    base = cache.pin(repo.index, slot, "base", f"refs/remotes/origin/{forge_repo.default_branch}")
    report.base = base
    withdrawn = withdrawn_at_claim(env, access, repo, task, issue)
    if withdrawn:
        report.outcome, report.reason = "paused", withdrawn
        _move(db, task, S.PAUSED, withdrawn, report)
        return
    scope = fingerprint(issue, config.labels.approved)
    # A plan a dead run recorded (for this base and scope) is posted as it was.
    pending = pending_plan(db, task.id, base, scope)
    if pending is None:
        proposed = _propose(env, db, guard, task, repo, slot, issue, base, report)
        if proposed is None:
            return
        decision = record_plan(db, task.id, base, scope, proposed)
        failpoint("planning.after_decision")
        pending = decision, proposed
    else:
        guard.start(None, {"base": base, "adopted": pending[0]})
    decision, milestones = pending
    marker = plan_marker(task.id, decision)
    where = (repo.owner, repo.name, issue.number)
    posted = posted_plan(planner, access.logins["planner"], *where, marker)
    if posted is None:
        body = plan_comment(
            task.id, milestones, config.labels.approved, config.planning.approve_command
        )
        posted = planner.create_comment(*where, f"{body}\n{marker}").id
    failpoint("planning.after_post")
    guard.finish("succeeded", f"posted a plan of {len(milestones)} milestones")
    spec = {
        "milestones": [m.model_dump() for m in milestones],
        # The scope this plan answers, read with the issue it planned (not poll's record,
        # which may lag: the plan step would plan again for a scope already planned).
        "fingerprint": scope,
        "comment": posted,
        # Timeline items share one sequence: only an approval after the plan counts.
        "approval_after": posted,
    }
    supersede_milestones(db, task.id)
    report.outcome, report.milestones = "planned", len(milestones)
    reason = f"posted a plan of {len(milestones)} milestones; awaiting approval"
    _move(db, task, S.AWAITING_PLAN_APPROVAL, reason, report, base_commit=base, spec=spec)


def _propose(
    env: Environment,
    db: Database,
    guard: PhaseGuard,
    task: Task,
    repo: Repository,
    slot: int,
    issue: Issue,
    base: str,
    report: PlanReport,
) -> list[MilestoneSpec] | None:
    """Run the planner at BASE; its milestones once they pass the bounds, else None (the
    report says why: a failed run, a plan out of bounds, questions)."""
    config = env.loaded.config
    cache = GitCache(env.state_dir)
    exhausted = budget_spent(env, db, task.id, PHASE)
    if exhausted:
        guard.recover(exhausted)
        report.outcome, report.reason = "failed", "budget spent"
        return None
    admission = admit(env, db, PHASE)
    report.decisions = admission.decisions
    if admission.provider is None:
        report.outcome, report.reason = "unavailable", "no provider is eligible for planning now"
        _move(db, task, S.READY, report.reason, report)
        return None
    limit = config.planning.max_milestones
    run = run_model_phase(
        env,
        db,
        guard,
        admission,
        bundle=cache.bundle_out(
            repo.index, slot, workspaces_dir(env) / f"task-{task.id}-plan.bundle"
        ),
        ref=f"refs/aiworker/slot-{slot}/base",
        inputs={
            "prompt.md": plan_prompt(issue, limit),
            "context.json": json.dumps(
                {"repository": f"{repo.owner}/{repo.name}", "issue": issue.number, "base": base}
            ),
            "continuation.json": continuation_json(
                db, cache, task=task, repo=repo, phase=PHASE, issue=issue, base=base
            ),
        },
        read_only=True,
        recorded={"base": base},
    )
    report.provider, report.attempt = run.provider, run.attempt
    result: AgentResult | None = run.result
    asks = result is not None and bool(result.questions or result.completion == "needs_input")
    problems = [] if result is None or asks else plan_problems(result.milestones, limit)
    if result is not None and not asks and result.completion != "complete":
        problems.insert(0, f"the planner reported {result.completion}")
    if result is None or problems:
        failure = run.failure or "invalid"
        reason = run.reason or "not a plan: " + "; ".join(problems)
        guard.finish(failure, reason[:1000], refunded=failure == "quota_exhausted")
        report.outcome, report.reason = failure, reason[:1000]
        guard.recover(f"{failure}: {reason}")
        return None
    if asks:
        questions = list(result.questions) or [result.summary]
        guard.finish("needs_input", "; ".join(questions)[:1000])
        report.outcome, report.reason = "needs_input", "; ".join(questions)[:1000]
        if _move(db, task, S.NEEDS_INPUT, report.reason, report):
            comment_on_issue(
                env,
                db,
                task.id,
                "aiworker needs answers before it can plan this issue:\n"
                + "\n".join(f"- {q}" for q in questions)
                + "\n\nEditing the issue makes it eligible again.",
            )
        return None
    return list(result.milestones)


def _move(
    db: Database, task: Task, to_state: str, reason: str, report: PlanReport, **changes: object
) -> bool:
    """The phase's last move, releasing the slot; a task paused or cancelled meanwhile keeps
    that state (False)."""
    try:
        with db.write() as session:
            task.version = advance(
                session,
                task.id,
                S.PLANNING,
                task.version,
                to_state,
                reason,
                actor=PHASE,
                kind="plan.posted" if to_state == S.AWAITING_PLAN_APPROVAL else "task.transition",
                # A scope recorded meanwhile: the plan keeps the fingerprint it answered, and
                # the plan step plans again when the issue no longer matches it.
                follow_data_changes=True,
                **{**RELEASE, **changes},
            )
    except TransitionRefused as exc:
        report.state = exc.refusal.actual_state or "gone"
        return False
    report.reason, report.state = reason, to_state
    return True
