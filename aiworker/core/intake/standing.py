"""Whether authorised work still stands: judged by its authoriser's permission at every
poll, and re-verified from the issue's timeline by every gate (claim, publish, merge)."""

from __future__ import annotations

from dataclasses import dataclass

from aiworker.adapters.forgejo.models import Issue
from aiworker.core.context import Environment
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.intake.authorization import (
    Covered,
    Decision,
    PermissionReader,
    authorize,
    still_standing,
)
from aiworker.core.tasks.states import ACTIVE, TaskState
from aiworker.store.discovery import authorizers, repository_at, tasks_of
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task


def still_authorized(
    env: Environment, access: ForgeAccess, owner: str, name: str, task: Task, issue: Issue
) -> Decision:
    """Re-verify, from the issue's timeline now, that TASK's work is still authorised and
    that its authorisation covers the issue as it reads now. A milestone stands on its
    plan's label, on the plan's issue."""
    kind, covered = "plan", None
    if task.kind != "milestone":
        kind, covered = task.kind, Covered(task.authorized_scope, task.authorized_item)
    return authorize(
        access.required("worker"),
        PermissionReader(access.optional("operator"), access.bots()),
        env.loaded.config,
        owner,
        name,
        kind,
        issue,
        access.logins["worker"],
        covered,
    )


@dataclass
class Standing:
    """What a poll knows of the tasks it did not judge from a timeline: who authorised each,
    and why those whose authoriser may no longer do so are withdrawn."""

    looked_at: set[int] | None  # issue numbers judged from their timelines (None: all)
    authorizers: dict[int, str]  # task id -> who authorised it
    withdrawn: dict[int, str]  # task id -> why


def judge_standing(
    db: Database,
    reader: PermissionReader,
    index: int,
    owner: str,
    name: str,
    looked_at: set[int] | None,
) -> Standing:
    """Judge every active task whose issue this poll did not read by its authoriser's
    permission now (read outside the write transaction)."""
    with db.read() as session:
        repo = repository_at(session, index)
        known = tasks_of(session, repo.id) if repo else {}
        stored = authorizers(session, [task.id for task in known.values()])
    withdrawn = {}
    for (kind, number), task in known.items():
        if looked_at is None or number in looked_at or kind == "milestone":
            continue
        actor = stored.get(task.id)
        if actor is None or task.state not in ACTIVE or task.state == TaskState.APPROVED:
            continue
        decision = still_standing(reader, owner, name, actor)
        if not decision.authorized:
            withdrawn[task.id] = decision.reason
    return Standing(looked_at, stored, withdrawn)


def withdrawn_at_claim(
    env: Environment,
    access: ForgeAccess,
    repo: Repository,
    task: Task,
    issue: Issue,
) -> str | None:
    """Why a claimed task may not be worked on now because its authorisation was withdrawn
    (None when it stands). A milestone stands on its plan's label, on the plan's issue:
    its caller lets it wait (poll pauses the plan, which a milestone waits for)."""
    decision = still_authorized(env, access, repo.owner, repo.name, task, issue)
    return None if decision.authorized else f"authorisation no longer holds: {decision.reason}"
