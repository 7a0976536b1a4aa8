"""A merge of the task's pull request, recorded: by aiworker's merge step, or by a
person on the forge while the task was still being checked, reviewed or repaired (what
was still to come is not run: the work is delivered)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.models import PullRequest
from aiworker.core.phases.job import Job
from aiworker.core.phases.outcome import Outcome
from aiworker.core.report import Report
from aiworker.core.tasks.milestones import plan_milestones
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import NeedsPerson
from aiworker.store.publications import close_publication
from aiworker.store.receipts import add_receipt


@dataclass
class MergeReport(Report):
    task: int
    pr: int
    head: str
    merge_commit: str | None
    merged_at: str | None
    merged_by: str | None = None
    # repairing (awaiting_plan_approval for a plan): the issue changed after the review,
    # or the base moved into a conflict with the work; nothing was merged.
    state: str = S.DONE


def merged(job: Job, pull: PullRequest, client: ForgejoClient, *, ours: bool) -> Outcome:
    """The task's PR is merged (OURS: by aiworker's merge step; else a person merged it
    on the forge, and the checks and review still to come are not run: it is delivered).
    The merge is recorded as evidence, kept whatever becomes of the move, and the task
    is done. A person's merge into another branch than the default one delivered
    nothing: NeedsPerson (read with CLIENT)."""
    task, repo = job.task, job.repo
    target = "" if ours else client.repository(repo.owner, repo.name).default_branch
    if not ours and pull.base.ref != target:
        raise NeedsPerson(
            f"PR #{pull.number} was merged on the forge into {pull.base.ref}, not {target}: the "
            f"work is not delivered (start it over: `aiworker task retry --from-start "
            f"{task.id}`, or cancel it)"
        )
    by = pull.merged_by.login if pull.merged_by is not None else None
    merged_at = pull.merged_at.isoformat() if pull.merged_at else None
    head = pull.head.sha
    evidence: dict[str, Any] = {
        "pr": pull.number,
        "head": head,
        "merge_commit": pull.merge_commit_sha,
        "merged_at": merged_at,
        "merged_by": by,
        "by_aiworker": ours,
    }
    milestones = [(c.id, c.head_commit) for c in plan_milestones(job.db, task)]
    if milestones:
        evidence["milestones"] = [{"task": t, "head": h} for t, h in milestones]
    with job.db.write() as session:
        add_receipt(
            session,
            task_id=task.id,
            phase=job.phase.name,
            head=head,
            base=task.base_commit or head,
            scope=task.scope_fingerprint,
            check_id=None,
            outcome="merged",
            body=evidence,
        )
    why = f"merged as {pull.merge_commit_sha}"
    if not ours:
        unchecked = "" if head == task.head_commit else f" (not {str(task.head_commit)[:12]})"
        why = (
            f"PR #{pull.number} was merged on the forge by {by or 'a person'} at {head[:12]}"
            f"{unchecked} while the task was {job.started}: {why}; nothing more runs for it"
        )
    report = MergeReport(task.id, pull.number, head, pull.merge_commit_sha, merged_at, by)
    job.report = report
    landing = Outcome(
        report,
        S.DONE,
        why,
        kind="merge.done",
        data=evidence,
        follow_up=False,
        writes=lambda session: close_publication(session, task.id, "merged", head),
    )
    return landing.ended("succeeded", why)
