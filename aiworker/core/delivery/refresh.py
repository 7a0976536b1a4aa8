"""Base refresh: when the base moved after the work was done, the work is brought forward.

An ordinary merge commit of the new base into the task's head (parents: the work,
then the base; made in the git cache without a work tree) becomes the new head; the
quality gate re-runs every required check at it, on the new base; the task records
the new head and base; publication then goes ahead on those fresh receipts. The
earlier commits stay the merge's first parent: no work is discarded.

A conflicting move is merged all the same with git's conflict markers left in the
conflicting files, and a conflict-repair episode starts from that merge
(tasks/repairs.py); checks that fail on a clean merge start a repair episode from the
merge too. Publication waits for the repaired work. The merge step takes the same
conflict repair for a base that moved into a conflict after the review.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.models import Issue
from aiworker.contracts.agent import Finding
from aiworker.core.intake.scope import base_problems
from aiworker.core.phases.at_head import gate_at
from aiworker.core.phases.job import Job
from aiworker.core.phases.outcome import Outcome
from aiworker.core.report import Report
from aiworker.core.tasks.milestones import checks_of
from aiworker.core.tasks.repairs import RepairRequest, record_refreshed_base
from aiworker.errors import NeedsPerson
from aiworker.runtime.gitcache import GitCache
from aiworker.store.engine import Database
from aiworker.store.models import Task
from aiworker.store.receipts import receipts_for


@dataclass(frozen=True)
class Refreshed:
    head: str
    base: str
    version: int


def refresh_base(
    job: Job,
    issue: Issue,
    worker: ForgejoClient,
    token: str,
    base_now: str,
    default_branch: str,
    report: Report,
) -> Refreshed | Outcome:
    """The refreshed head and base (recorded on the task), or how the step ends instead:
    a repair episode."""
    db, task = job.db, job.task
    GitCache(job.env.state_dir).fetch(
        job.repo.index, worker.repository(job.repo.owner, job.repo.name).clone_url, token
    )
    refuse_a_broken_base(job, base_now, default_branch)
    merged = merge_moved_base(job, worker, base_now, default_branch, report)
    if isinstance(merged, Outcome):
        return merged
    head = merged
    requirements = checks_of(db, task, issue.body)
    failed = _known_failures(db, task, head, base_now, [r.check_id for r in requirements])
    if failed is None:
        failed = gate_at(job, head, base_now, requirements).failures()
    if failed:
        why = f"after merging {base_now[:12]} the checks fail: {', '.join(failed)}"
        findings = [Finding(severity="blocker", message=f) for f in failed]
        request = RepairRequest("base_checks", head, base_now, findings)
        return Outcome(report, repair=request, reason=f"the base moved; {why}")
    version = record_refreshed_base(db, task, head, base_now)
    return Refreshed(head, base_now, version)


def merge_moved_base(
    job: Job, worker: ForgejoClient, base_now: str, default_branch: str, report: Report
) -> str | Outcome:
    """The merge of BASE_NOW (in the git cache), where DEFAULT_BRANCH moved to, into the
    task's head (made once and kept), or, when they conflict, a conflict-repair episode
    that starts from the merge with its conflict markers."""
    task, repo = job.task, job.repo
    assert task.head_commit is not None
    cache = GitCache(job.env.state_dir)
    ref = f"refs/aiworker/task-{task.id}/refreshed"
    # A retry after a crash (or after a refusal) takes the merge made before: its receipts
    # still hold, so neither the merge nor the checks are repeated for the same move.
    head = cache.merge_of(repo.index, ref, task.head_commit, base_now)
    if head is not None:
        return head
    me = worker.current_user()
    head, conflicts = cache.merge_into(
        repo.index,
        task.head_commit,
        base_now,
        ref,
        f"Merge branch '{default_branch}' into aiworker/task-{task.id}",
        # The forge's no-reply form: a pushed commit never shows the bot's address.
        (me.full_name or me.login, f"{me.login}@noreply.localhost"),
        keep_conflicts=True,
    )
    if not conflicts:
        return head
    findings = [
        Finding(severity="blocker", message="merge conflict with the new base", path=p)
        for p in conflicts
    ]
    why = f"the base moved to {base_now[:12]}; merging it conflicts in {', '.join(conflicts)}"
    request = RepairRequest("conflict", head, base_now, findings, conflicts)
    return Outcome(report, repair=request, reason=why)


def refuse_a_broken_base(job: Job, base_now: str, default_branch: str) -> None:
    """NeedsPerson when BASE_NOW (in the git cache) is where no check could run: the
    base's fault, not the work's, so no repair could mend it."""
    problems = base_problems(GitCache(job.env.state_dir), job.repo.index, base_now)
    if problems:
        raise NeedsPerson(
            f"{default_branch} moved to {base_now[:12]}, where: {'; '.join(problems)} (fix "
            f"the repository and resume task {job.task.id}, or cancel it)"
        )


def _known_failures(
    db: Database, task: Task, head: str, base: str, checks: list[str]
) -> list[str] | None:
    """What the receipts already say about HEAD on BASE for this scope: the failed checks
    (empty when all passed), or None unless every one of CHECKS was run there."""
    with db.read() as session:
        found = [
            r
            for r in receipts_for(session, task.id, "validation")
            if (r.head_commit, r.base_commit, r.scope_fingerprint)
            == (head, base, task.scope_fingerprint)
        ]
    latest = {r.check_id: r for r in found}
    if set(checks) - set(latest):
        return None
    return [
        f"check {check} exited {r.body.get('exit_code')}"
        for check, r in latest.items()
        if r.outcome != "pass"
    ]
