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
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.intake.scope import fingerprint, no_commits
from aiworker.core.intake.standing import withdrawn_at_claim
from aiworker.core.phases.at_head import not_archived
from aiworker.core.phases.continuation import continuation_json
from aiworker.core.phases.job import Job
from aiworker.core.phases.model_run import admit, run_model_phase, slot_base
from aiworker.core.phases.outcome import Outcome
from aiworker.core.phases.plan_decisions import (
    pending_plan,
    plan_marker,
    posted_plan,
    record_plan,
)
from aiworker.core.phases.prompts import plan_prompt
from aiworker.core.phases.reports import AttemptReport, ended, needs_input
from aiworker.core.tasks.milestones import plan_comment, plan_problems, supersede_milestones
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import EXIT_OK
from aiworker.runtime.failpoints import failpoint
from aiworker.runtime.gitcache import GitCache


@dataclass
class PlanReport(AttemptReport):
    milestones: int = 0  # how many the posted plan proposes

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.outcome == "planned" else super().exit_code


def plan(job: Job) -> Outcome:
    env, db, task, repo, slot = job.env, job.db, job.task, job.repo, job.slot or 0
    report = PlanReport(task.id, "running")
    job.report = report
    config = env.loaded.config
    access = ForgeAccess(env.loaded)
    planner = access.required("planner")
    issue = planner.issue(repo.owner, repo.name, task.issue_number or 0)
    forge_repo = planner.repository(repo.owner, repo.name)
    not_archived(task.id, forge_repo)
    cache = GitCache(env.state_dir)
    branches = cache.fetch(repo.index, forge_repo.clone_url, access.token("planner"))
    if forge_repo.default_branch not in branches:
        return needs_input(report, [no_commits(forge_repo.default_branch)])
    base = cache.pin(repo.index, slot, "base", f"refs/remotes/origin/{forge_repo.default_branch}")
    report.base = base
    withdrawn = withdrawn_at_claim(env, access, repo, task, issue)
    if withdrawn:
        return ended(report, S.PAUSED, "paused", withdrawn)
    scope = fingerprint(issue, config.labels.approved)
    # A plan a dead run recorded (for this base and scope) is posted as it was.
    pending = pending_plan(db, task.id, base, scope)
    if pending is None:
        proposed = _propose(job, issue, base, report)
        if isinstance(proposed, Outcome):
            return proposed
        decision = record_plan(db, task.id, base, scope, proposed)
        failpoint("planning.after_decision")
        pending = decision, proposed
    else:
        job.start(None, {"base": base, "adopted": pending[0]})
    decision, milestones = pending
    marker = plan_marker(task.id, decision)
    where = (repo.owner, repo.name, issue.number)
    posted = posted_plan(planner, access.logins["planner"], *where, marker)
    if posted is None:
        body = plan_comment(
            task.id, milestones, config.labels.approved, config.planning.approve_command
        )
        posted = planner.create_comment(*where, f"{job.env.for_the_forge(body)}\n{marker}").id
    failpoint("planning.after_post")
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
    report.reason = f"posted a plan of {len(milestones)} milestones; awaiting approval"
    # A scope recorded meanwhile: the plan keeps the fingerprint it answered, and the plan
    # step plans again when the issue no longer matches it.
    landing = Outcome(
        report,
        S.AWAITING_PLAN_APPROVAL,
        report.reason,
        # A new plan builds on its base: the head an earlier plan's milestones left is not
        # this one's.
        {"base_commit": base, "head_commit": None, "spec": spec},
        kind="plan.posted",
    )
    return landing.ended("succeeded", f"posted a plan of {len(milestones)} milestones")


def _propose(
    job: Job, issue: Issue, base: str, report: PlanReport
) -> list[MilestoneSpec] | Outcome:
    """Run the planner at BASE; its milestones once they pass the bounds, else how the
    phase ends (a failed run, a plan out of bounds, questions)."""
    env, db, repo = job.env, job.db, job.repo
    name = job.phase.name
    cache = GitCache(env.state_dir)
    admission = admit(env, db, name)
    report.decisions = admission.decisions
    if admission.provider is None:
        return ended(report, S.READY, "unavailable", "no provider is eligible for planning now")
    limit = env.loaded.config.planning.max_milestones
    inputs = {
        "prompt.md": plan_prompt(issue, limit),
        "context.json": json.dumps(
            {"repository": f"{repo.owner}/{repo.name}", "issue": issue.number, "base": base}
        ),
        "continuation.json": continuation_json(job, cache, issue, base),
    }
    run = run_model_phase(
        job, admission, slot_base(job, cache), inputs, {"base": base}, read_only=True
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
        report.outcome, report.reason = failure, reason[:1000]
        landing = Outcome(report, retry=S.READY, reason=f"{failure}: {reason}")
        return landing.ended(failure, reason, refunded=failure == "quota_exhausted")
    if asks:
        questions = list(result.questions) or [result.summary]
        heading = "aiworker needs answers before it can plan this issue:"
        return needs_input(report, questions, heading).ended("needs_input", "; ".join(questions))
    return list(result.milestones)
