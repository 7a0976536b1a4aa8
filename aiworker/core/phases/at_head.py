"""What a phase's body checks at its task's head: that the pull request is still open
there, and the requirements, run on it as worker jobs."""

from __future__ import annotations

from typing import Unpack

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.models import PullRequest, Repository
from aiworker.core.evidence.gate import CheckExtras, GateReport, run_checks
from aiworker.core.evidence.requirements import Requirement
from aiworker.core.phases.job import Job
from aiworker.core.runner.dispatch import Dispatch
from aiworker.errors import Conflict, NeedsPerson


def pull_at_head(job: Job, client: ForgejoClient) -> PullRequest:
    """The task's PR, which must still be open at the task's receipt head, or merged
    (by a person, at whatever head they merged: see merged.py)."""
    assert job.pr is not None
    pull = client.pull(job.repo.owner, job.repo.name, job.pr)
    closed_by_person(job.task.id, pull)
    if not pull.merged and pull.head.sha != job.task.head_commit:
        evidence = job.task.head_commit
        raise Conflict(
            f"PR #{job.pr} head moved to {pull.head.sha}; the evidence is for {evidence}"
        )
    return pull


def closed_by_person(task_id: int, pull: PullRequest) -> None:
    """NeedsPerson when PULL, the task's open publication, was closed unmerged: aiworker
    closes its own PRs only as it ends a publication, so a person did."""
    if pull.state == "closed" and not pull.merged:
        raise NeedsPerson(
            f"PR #{pull.number} was closed on the forge without being merged (reopen it, or "
            f"cancel task {task_id})"
        )


def not_archived(task_id: int, forge_repo: Repository) -> None:
    """NeedsPerson when a person archived the repository on the forge: nothing made for
    it could be published, so no inference is spent on it."""
    if forge_repo.archived:
        raise NeedsPerson(
            f"{forge_repo.full_name} is archived on the forge, which takes no change to it "
            f"(unarchive it, or cancel task {task_id})"
        )


def gate_at(
    job: Job, head: str, base: str, requirements: list[Requirement], **options: Unpack[CheckExtras]
) -> GateReport:
    """Run REQUIREMENTS for the task at HEAD on BASE as worker jobs, its receipts recorded
    (OPTIONS: the phase they are for, the result a model claimed)."""
    return run_checks(
        job.db,
        Dispatch.of(job.env, job.db, job.attempt),
        index=job.repo.index,
        head=head,
        base=base,
        task_id=job.task.id,
        scope=job.task.scope_fingerprint,
        requirements=requirements,
        **options,
    )
