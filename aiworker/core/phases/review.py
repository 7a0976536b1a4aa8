"""`aiworker review --task ID`: an independent review of the PR head by the reviewer identity.

The review phase runs with its own provider settings on a read-only workspace
of the exact head, inside the phase guard; its result document decides the
formal review: blocking findings (major, blocker) or an incomplete review
request changes, anything else approves. The review is posted on the head
commit it inspected; requested changes start a repair episode on the same branch
(tasks/repairs.py), after which a fresh review follows. A failed review attempt
leaves the task awaiting review while its budget lasts, then fails it with a comment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiworker.contracts.agent import AgentResult, Finding
from aiworker.core.context import Environment, hold_job_lock
from aiworker.core.delivery.pull import load_delivery, move, pull_at_head
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.guests.backends import backend_for
from aiworker.core.phases.continuation import continuation_json
from aiworker.core.phases.engine import admit, run_model_phase, workspaces_dir
from aiworker.core.phases.guard import PhaseGuard
from aiworker.core.phases.prompts import review_prompt
from aiworker.core.report import Report
from aiworker.core.scheduling.launcher import follow_up_if_asked
from aiworker.core.tasks.budgets import budget_spent, land_after_failure
from aiworker.core.tasks.repairs import RepairRequest, request_repair
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE
from aiworker.runtime.gitcache import GitCache
from aiworker.store.engine import Database
from aiworker.store.models import Task

PHASE = "review"
BLOCKING = ("major", "blocker")


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


def review_body(result: AgentResult) -> str:
    lines = [result.summary]
    for finding in result.findings:
        where = (
            f" ({finding.path}:{finding.line})"
            if finding.path and finding.line
            else (f" ({finding.path})" if finding.path else "")
        )
        lines.append(f"- [{finding.severity}] {finding.message}{where}")
    return "\n".join(lines)


def _request_changes(
    env: Environment, db: Database, task: Task, result: AgentResult, head: str, review: int
) -> str:
    """Changes were requested: a repair episode takes the findings on, on the same branch."""
    findings = list(result.findings)
    if result.completion != "complete":
        message = f"the review could not be completed: {result.summary}"
        findings.append(Finding(severity="blocker", message=message[:20_000]))
    request = RepairRequest("review", head, task.base_commit or head, findings)
    why = f"review {review} requested changes at {head[:12]}"
    return request_repair(env, db, task, S.AWAITING_REVIEW, request, why)


def review(env: Environment, task_id: int) -> ReviewReport:
    db = env.open_database()
    try:
        delivery = load_delivery(db, task_id, S.AWAITING_REVIEW)
        lock = hold_job_lock(env, f"task-{task_id}")
        task, repo = delivery.task, delivery.repo
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
            reviewer = ForgeAccess(env.loaded).required("reviewer")
            pull = pull_at_head(reviewer, delivery)
            exhausted = budget_spent(env, db, task.id, PHASE)
            if exhausted:
                guard.recover(exhausted)
                report.reason = "budget spent"
                return report
            admission = admit(env, db, PHASE)
            if admission.provider is None:
                report.reason = "no provider is eligible for review now"
                return report
            ref = f"refs/aiworker/review/task-{task.id}"
            issue = reviewer.issue(repo.owner, repo.name, task.issue_number or 0)
            cache = GitCache(env.state_dir)
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
                return report
            result = run.result
            blocking = [f for f in result.findings if f.severity in BLOCKING]
            event = "REQUEST_CHANGES" if blocking or result.completion != "complete" else "APPROVED"
            posted = reviewer.create_review(
                repo.owner,
                repo.name,
                pull.number,
                event=event,
                body=review_body(result),
                commit_id=head,
            )
            guard.finish("succeeded", f"posted {event}")
            if event == "APPROVED":
                to_state: str = S.APPROVED
                move(
                    db,
                    task,
                    S.AWAITING_REVIEW,
                    to_state,
                    "review.posted",
                    {"event": event, "review": posted.id, "head": head},
                    f"{run.provider} reviewed {head[:12]}: {event}",
                )
            else:
                to_state = _request_changes(env, db, task, result, head, posted.id)
            report.event, report.review, report.state = event, posted.id, to_state
            report.findings = [f.model_dump() for f in result.findings]
        follow_up_if_asked(env)
        return report
    finally:
        db.dispose()
