"""Shared steps of the delivery phases after publication: load, verify the PR head, move."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from aiworker import logs
from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.models import CommitStatus, PullRequest
from aiworker.core.tasks.lifecycle import advance
from aiworker.errors import Conflict, InvalidInput
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task
from aiworker.store.publications import current_publication
from aiworker.store.tasks import append_event

CI_CONTEXT = "aiworker / ci"


@dataclass
class Delivery:
    task: Task
    repo: Repository
    pr: int


def load_delivery(db: Database, task_id: int, state: str) -> Delivery:
    logs.task_id.set(task_id)  # this job's log lines name its task from here on
    with db.read() as session:
        task = session.get(Task, task_id)
        repo = session.get(Repository, task.repository_id) if task else None
        publication = current_publication(session, task_id) if task else None
    if task is None or repo is None:
        raise InvalidInput(f"no task {task_id}")
    if task.state != state:
        raise Conflict(f"task {task_id} is {task.state}, not {state}")
    if publication is None or publication.pr_number is None:
        raise Conflict(f"task {task_id} has no open pull request")
    return Delivery(task, repo, publication.pr_number)


def ours_passed(statuses: list[CommitStatus], ours: Collection[str | None]) -> bool:
    """Whether one of OURS posted a success in aiworker's CI context among STATUSES: only
    our own CI's word counts, as anyone with Write can post a status in its context."""
    return any(
        s.context == CI_CONTEXT
        and s.status == "success"
        and s.creator is not None
        and s.creator.login in ours
        for s in statuses
    )


def pull_at_head(client: ForgejoClient, delivery: Delivery) -> PullRequest:
    """The PR, which must still be open at the task's receipt head."""
    pull = client.pull(delivery.repo.owner, delivery.repo.name, delivery.pr)
    if pull.head.sha != delivery.task.head_commit:
        raise Conflict(
            f"PR #{delivery.pr} head moved to {pull.head.sha}; "
            f"the evidence is for {delivery.task.head_commit}"
        )
    return pull


def move(
    db: Database,
    task: Task,
    from_state: str,
    to_state: str,
    kind: str,
    data: dict[str, Any],
    reason: str,
) -> None:
    """Advance TASK as this step loaded it; a task that moved meanwhile refuses the move."""
    with db.write() as session:
        task.version = advance(
            session,
            task.id,
            from_state,
            task.version,
            to_state,
            reason,
            actor=kind.split(".", maxsplit=1)[0],
            kind=kind,
            data=data,
            follow_data_changes=True,
        )


def record(db: Database, task: Task, kind: str, data: dict[str, Any]) -> None:
    with db.write() as session:
        append_event(session, kind, task_id=task.id, data=data)
