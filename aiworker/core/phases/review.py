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
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.phases.at_head import not_archived, pull_at_head
from aiworker.core.phases.continuation import continuation_json
from aiworker.core.phases.job import Job
from aiworker.core.phases.merged import merged
from aiworker.core.phases.model_run import admit, run_model_phase, workspaces_dir
from aiworker.core.phases.outcome import Outcome
from aiworker.core.phases.prompts import review_prompt
from aiworker.core.phases.review_decisions import (
    Decided,
    pending_decision,
    record_decision,
    review_body,
    review_marker,
)
from aiworker.core.report import Report
from aiworker.core.tasks.repairs import RepairRequest
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE
from aiworker.runtime.failpoints import failpoint
from aiworker.runtime.gitcache import GitCache


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
    # No provider was eligible: nothing was spent, and the task waits for one.
    unavailable: bool = field(default=False, metadata={"internal": True})

    @property
    def exit_code(self) -> int:
        if self.event == "APPROVED":
            return EXIT_OK
        return EXIT_UNAVAILABLE if self.unavailable else EXIT_FAILED


def review(job: Job) -> Outcome:
    env, db, task = job.env, job.db, job.task
    assert job.pr is not None
    assert task.head_commit is not None
    head = task.head_commit
    report = ReviewReport(task.id, job.pr, state=S.AWAITING_REVIEW)
    job.report = report
    access = ForgeAccess(env.loaded)
    reviewer = access.required("reviewer")
    pull = pull_at_head(job, reviewer)
    if pull.merged:  # by a person: no review is spent on it
        return merged(job, pull, reviewer, ours=False)
    # A decision recorded by a run that died before it posted or moved the task is
    # delivered as it was: no second inference, no second review.
    decided = pending_decision(db, task.id, head)
    if decided is None:
        reached = _decide(job, reviewer, pull, report)
        if isinstance(reached, Outcome):
            return reached
        decided = reached
    else:
        job.start(None, {"head": head, "adopted": decided.event})
    posted = _post(reviewer, access.logins["reviewer"], job, decided)
    failpoint("review.after_post")
    report.event, report.review, report.provider = decided.event, posted, decided.provider
    report.findings = [f.model_dump() for f in decided.findings]
    if decided.event == "APPROVED":
        landing = Outcome(
            report,
            S.APPROVED,
            f"{decided.provider} reviewed {head[:12]}: {decided.event}",
            kind="review.posted",
            data={"event": decided.event, "review": posted, "head": head},
        )
        return landing.ended("succeeded", f"posted {decided.event}")
    # Changes were requested: a repair episode takes the findings on, on the same branch.
    findings = list(decided.findings)
    if decided.completion != "complete":
        message = f"the review could not be completed: {decided.summary}"
        findings.append(Finding(severity="blocker", message=message[:20_000]))
    request = RepairRequest("review", head, task.base_commit or head, findings)
    why = f"review {posted} requested changes at {head[:12]}"
    return Outcome(report, repair=request, reason=why).ended("succeeded", f"posted {decided.event}")


def _decide(
    job: Job, reviewer: ForgejoClient, pull: PullRequest, report: ReviewReport
) -> Decided | Outcome:
    """Run the review on the exact head and record its decision before anything is posted;
    how the step ends instead when no decision was reached."""
    env, db, task, repo = job.env, job.db, job.task, job.repo
    name = job.phase.name
    head = str(task.head_commit)
    forge_repo = reviewer.repository(repo.owner, repo.name)
    not_archived(task.id, forge_repo)  # its verdict could not be acted on
    admission = admit(env, db, name)
    if admission.provider is None:
        report.reason, report.unavailable = "no provider is eligible for review now", True
        return Outcome(report, follow_up=False)
    ref = f"refs/aiworker/review/task-{task.id}"
    issue = reviewer.issue(repo.owner, repo.name, task.issue_number or 0)
    cache = GitCache(env.state_dir)
    clone_url = forge_repo.clone_url
    cache.ensure(repo.index, clone_url, ForgeAccess(env.loaded).token("reviewer"), head)
    bundle = cache.bundle_commit(
        repo.index, head, ref, workspaces_dir(env) / f"task-{task.id}-{name}.bundle"
    )
    inputs = {
        "prompt.md": review_prompt(pull),
        "context.json": json.dumps({"pr": pull.number, "head": head}),
        "continuation.json": continuation_json(
            job, cache, issue, task.base_commit or head, head=head
        ),
    }
    run = run_model_phase(job, admission, (bundle, ref), inputs, {"head": head}, read_only=True)
    report.provider = run.provider
    if run.result is None:
        report.reason = run.reason
        why = f"{run.failure}: {run.reason}"
        landing = Outcome(report, retry=S.AWAITING_REVIEW, reason=why, follow_up=False)
        quota = run.failure == "quota_exhausted"
        return landing.ended(run.failure or "failed", run.reason, refunded=quota)
    decided = record_decision(db, task.id, Decided.of(run.result, run.provider, head))
    failpoint("review.after_decision")
    return decided


def _post(reviewer: ForgejoClient, login: str, job: Job, decided: Decided) -> int:
    """The formal review on the head, posted once: the one a dead run already posted for
    this decision (by the reviewer, with the decision's marker and verdict) is taken."""
    task, repo = job.task, job.repo
    assert job.pr is not None
    marker = review_marker(task.id, decided)
    for found in reviewer.reviews(repo.owner, repo.name, job.pr):
        mine = found.user is not None and found.user.login == login
        if mine and found.state == decided.event and marker in found.body:
            return found.id
    posted = reviewer.create_review(
        repo.owner,
        repo.name,
        job.pr,
        event=decided.event,
        body=f"{job.env.for_the_forge(review_body(decided))}\n\n{marker}",
        commit_id=decided.head,
    )
    return posted.id
