"""Base refresh: when the base moved after the work was done, the work is brought forward.

An ordinary merge commit of the new base into the task's head (parents: the work,
then the base; made in the git cache without a work tree) becomes the new head; the
quality gate re-runs every required check at it, on the new base; the task records
the new head and base; publication then goes ahead on those fresh receipts. The
earlier commits stay the merge's first parent: no work is discarded. A conflicting
move, or checks that fail after the merge, are refused with their reason (a repair
episode is what would take them on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.models import Issue
from aiworker.core.context import Environment
from aiworker.core.evidence.gate import run_checks
from aiworker.core.intake.scope import requirements_from_issue
from aiworker.core.tasks.lifecycle import advance
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import Conflict
from aiworker.runtime.gitcache import GitCache, MergeConflicts
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task
from aiworker.store.tasks import append_event


@dataclass(frozen=True)
class Refreshed:
    head: str
    base: str
    version: int


def refresh_base(
    env: Environment,
    db: Database,
    task: Task,
    repo: Repository,
    issue: Issue,
    worker: ForgejoClient,
    token: str,
    base_now: str,
    default_branch: str,
) -> Refreshed:
    assert task.head_commit is not None
    cache = GitCache(env.state_dir)
    cache.fetch(repo.index, worker.repository(repo.owner, repo.name).clone_url, token)
    me = worker.current_user()
    try:
        head = cache.merge_into(
            repo.index,
            task.head_commit,
            base_now,
            f"refs/aiworker/task-{task.id}/refreshed",
            f"Merge branch '{default_branch}' into aiworker/task-{task.id}",
            (me.full_name or me.login, me.email or f"{me.login}@users.noreply"),
        )
    except MergeConflicts as exc:
        _refused(db, task, str(exc))
    gate = run_checks(
        db,
        cache,
        index=repo.index,
        head=head,
        base=base_now,
        task_id=task.id,
        scope=task.scope_fingerprint,
        requirements=requirements_from_issue(issue.body),
    )
    if not gate.passed:
        _refused(db, task, f"after merging {base_now[:12]}: {'; '.join(gate.findings)}")
    with db.write() as session:
        version = advance(
            session,
            task.id,
            S.IMPLEMENTED,
            task.version,
            S.IMPLEMENTED,
            f"the base moved to {base_now[:12]}: merged it into the work as {head[:12]}; "
            "every required check passed there",
            actor="publish",
            kind="task.base_refreshed",
            data={"from_base": task.base_commit, "base": base_now, "head": head},
            head_commit=head,
            base_commit=base_now,
        )
    return Refreshed(head, base_now, version)


def _refused(db: Database, task: Task, reason: str) -> NoReturn:
    with db.write() as session:
        append_event(session, "publish.refused", task_id=task.id, data={"reason": reason})
    raise Conflict(f"task {task.id} cannot be published: the base moved; {reason}")
