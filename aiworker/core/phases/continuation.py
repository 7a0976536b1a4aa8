"""The continuation artifact a phase finds beside its prompt (contracts/continuation.py):
built by the host from its own records (the task, its receipts and attempts, the git
cache), so it says only what was measured, never what a model said it did."""

from __future__ import annotations

from collections.abc import Sequence

from aiworker.adapters.forgejo.models import Issue
from aiworker.contracts.agent import Finding
from aiworker.contracts.continuation import Continuation, Evidence, PriorAttempt, Scope
from aiworker.core.evidence.requirements import requirements_from_issue
from aiworker.core.phases.job import Job
from aiworker.runtime.gitcache import GitCache
from aiworker.store.attempts import attempts_of
from aiworker.store.receipts import receipts_of

MAX_ROWS = 200


def continuation_json(
    job: Job,
    cache: GitCache,
    issue: Issue,
    base: str,
    head: str | None = None,
    findings: Sequence[Finding] = (),
) -> str:
    """The continuation of JOB's task for its phase: the issue's scope, the commits from
    BASE to HEAD, FINDINGS to resolve, and what the host measured and tried before."""
    task, repo, phase = job.task, job.repo, job.phase.name
    with job.db.read() as session:
        receipts = receipts_of(session, task.id)
        attempts = attempts_of(session, task.id)
        document = Continuation(
            task=task.id,
            phase=phase,
            scope=Scope(
                title=issue.title[:2_000],
                fingerprint=task.scope_fingerprint,
                checks=[[r.check_id, *r.argv] for r in requirements_from_issue(issue.body)],
            ),
            base=base,
            head=head,
            commits=cache.commits(repo.index, base, head)[:500] if head else [],
            findings=list(findings)[:MAX_ROWS],
            evidence=[
                Evidence(
                    phase=r.phase,
                    check_id=r.check_id,
                    outcome=r.outcome,
                    head=r.head_commit,
                    base=r.base_commit,
                )
                for r in receipts[-MAX_ROWS:]
            ],
            attempts=[
                PriorAttempt(
                    phase=a.phase,
                    provider=a.provider,
                    outcome=a.outcome,
                    reason=(a.reason or "")[:2_000] or None,
                )
                for a in attempts[-MAX_ROWS:]
                if a.finished_at is not None
            ],
        )
    return document.model_dump_json(indent=2)
