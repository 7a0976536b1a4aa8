"""`aiworker review --task ID`: an independent review of the PR head by the reviewer identity.

The review phase runs with its own provider settings on a read-only workspace
of the exact head, inside the phase guard; its result document decides the
formal review: blocking findings (major, blocker) or an incomplete review
request changes, anything else approves. The review is posted on the head
commit it inspected; requested changes start a repair episode on the same branch
(tasks/repairs.py), after which a fresh review follows. A failed review attempt
leaves the task awaiting review while its budget lasts, then fails it with a comment.
The decision is recorded before the review is posted, and the posted review carries a
marker (review_decisions.py): a run that dies in between is finished by the next one
without a second inference or a second review.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.models import PullRequest
from aiworker.contracts.agent import Finding
from aiworker.core.context import Environment
from aiworker.core.delivery.pull import Delivery, load_delivery, move, pull_at_head
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.guests.backends import backend_for
from aiworker.core.phases.continuation import continuation_json
from aiworker.core.phases.engine import admit, run_model_phase, workspaces_dir
from aiworker.core.phases.guard import PhaseGuard
from aiworker.core.phases.prompts import review_prompt
from aiworker.core.phases.review_decisions import (
    Decided,
    pending_decision,
    record_decision,
    review_body,
    review_marker,
)
from aiworker.core.report import Report
from aiworker.core.scheduling.launcher import follow_up_if_asked
from aiworker.core.tasks.budgets import budget_spent, land_after_failure
from aiworker.core.tasks.hosts import hold_task_lock
from aiworker.core.tasks.repairs import RepairRequest, request_repair
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE
from aiworker.runtime.failpoints import failpoint
from aiworker.runtime.gitcache import GitCache
from aiworker.store.engine import Database
from aiworker.store.models import Task

PHASE = "review"


@dataclass
class ReviewReport(Report):
    task: int
    pr: int
    event: str | None = None  # APPROVED | REQUEST_CHANGES; None when nothing was posted
    review: int | None = None
    provider: str | None = None
    reason: str = ""
    findings: list[dict[str, Any]] = field(default_factory=list)
    state: str = ""

    @property
    def exit_code(self) -> int:
        if self.event == "APPROVED":
            return EXIT_OK
        return EXIT_UNAVAILABLE if self.reason.startswith("no provider") else EXIT_FAILED


def _request_changes(
    env: Environment, db: Database, task: Task, decided: Decided, head: str, review: int
) -> str:
    """Changes were requested: a repair episode takes the findings on, on the same branch."""
    findings = list(decided.findings)
    if decided.completion != "complete":
        message = f"the review could not be completed: {decided.summary}"
        findings.append(Finding(severity="blocker", message=message[:20_000]))
    request = RepairRequest("review", head, task.base_commit or head, findings)
    why = f"review {review} requested changes at {head[:12]}"
    return request_repair(env, db, task, S.AWAITING_REVIEW, request, why)


def _decide(
    env: Environment,
    db: Database,
    guard: PhaseGuard,
    reviewer: ForgejoClient,
    delivery: Delivery,
    pull: PullRequest,
    report: ReviewReport,
) -> Decided | None:
    """Run the review on the exact head and record its decision before anything is posted;
    None when no decision was reached (the report says why)."""
    task, repo = delivery.task, delivery.repo
    head = str(task.head_commit)
    admission = admit(env, db, PHASE)
    if admission.provider is None:
        report.reason = "no provider is eligible for review now"
        return None
    ref = f"refs/aiworker/review/task-{task.id}"
    issue = reviewer.issue(repo.owner, repo.name, task.issue_number or 0)
    cache = GitCache(env.state_dir)
    clone_url = reviewer.repository(repo.owner, repo.name).clone_url
    cache.ensure(repo.index, clone_url, ForgeAccess(env.loaded).token("reviewer"), head)
    bundle = cache.bundle_commit(
        repo.index, head, ref, workspaces_dir(env) / f"task-{task.id}-{PHASE}.bundle"
    )
    run = run_model_phase(
        env,
        db,
        guard,
        admission,
        bundle=bundle,
        ref=ref,
        inputs={
            "prompt.md": review_prompt(pull),
            "context.json": json.dumps({"pr": pull.number, "head": head}),
            "continuation.json": continuation_json(
                db,
                cache,
                task=task,
                repo=repo,
                phase=PHASE,
                issue=issue,
                base=task.base_commit or head,
                head=head,
            ),
        },
        read_only=True,
        recorded={"head": head},
    )
    report.provider = run.provider
    if run.result is None:
        quota = run.failure == "quota_exhausted"
        guard.finish(run.failure or "failed", run.reason, refunded=quota)
        report.reason = run.reason
        guard.recover(f"{run.failure}: {run.reason}")
        return None
    decided = record_decision(db, task.id, Decided.of(run.result, run.provider, head))
    failpoint("review.after_decision")
    return decided


def _post(reviewer: ForgejoClient, login: str, delivery: Delivery, decided: Decided) -> int:
    """The formal review on the head, posted once: the one a dead run already posted for
    this decision (by the reviewer, with the decision's marker and verdict) is taken."""
    task, repo = delivery.task, delivery.repo
    marker = review_marker(task.id, decided)
    for found in reviewer.reviews(repo.owner, repo.name, delivery.pr):
        mine = found.user is not None and found.user.login == login
        if mine and found.state == decided.event and marker in found.body:
            return found.id
    posted = reviewer.create_review(
        repo.owner,
        repo.name,
        delivery.pr,
        event=decided.event,
        body=f"{review_body(decided)}\n\n{marker}",
        commit_id=decided.head,
    )
    return posted.id


def review(env: Environment, task_id: int) -> ReviewReport:
    db = env.open_database()
    try:
        delivery = load_delivery(db, task_id, S.AWAITING_REVIEW)
        task = delivery.task
        lock = hold_task_lock(env, db, task.id, task.state, task.version)
        head = task.head_commit
        assert head is not None
        report = ReviewReport(task.id, delivery.pr, state=S.AWAITING_REVIEW)

        def recover(reason: str) -> None:
            landed = land_after_failure(
                env,
                db,
                task.id,
                S.AWAITING_REVIEW,
                task.version,
                PHASE,
                reason,
                retry_state=S.AWAITING_REVIEW,
            )
            report.state = landed or "unchanged"

        with PhaseGuard(db, task.id, PHASE, recover, backend_for(env, PHASE), lock) as guard:
            access = ForgeAccess(env.loaded)
            reviewer = access.required("reviewer")
            pull = pull_at_head(reviewer, delivery)
            # A decision recorded by a run that died before it posted or moved the task
            # is delivered as it was: no second inference, no second review.
            decided = pending_decision(db, task.id, head)
            exhausted = None if decided else budget_spent(env, db, task.id, PHASE)
            if exhausted:
                guard.recover(exhausted)
                report.reason = "budget spent"
                return report
            if decided is None:
                decided = _decide(env, db, guard, reviewer, delivery, pull, report)
                if decided is None:
                    return report
            else:
                guard.start(None, {"head": head, "adopted": decided.event})
            posted = _post(reviewer, access.logins["reviewer"], delivery, decided)
            failpoint("review.after_post")
            guard.finish("succeeded", f"posted {decided.event}")
            if decided.event == "APPROVED":
                to_state: str = S.APPROVED
                move(
                    db,
                    task,
                    S.AWAITING_REVIEW,
                    to_state,
                    "review.posted",
                    {"event": decided.event, "review": posted, "head": head},
                    f"{decided.provider} reviewed {head[:12]}: {decided.event}",
                )
            else:
                to_state = _request_changes(env, db, task, decided, head, posted)
            report.event, report.review, report.state = decided.event, posted, to_state
            report.provider = decided.provider
            report.findings = [f.model_dump() for f in decided.findings]
        follow_up_if_asked(env)
        return report
    finally:
        db.dispose()
