"""Telling people on the forge what became of a task: a comment on its issue.

A comment is best effort: the state change it explains is already recorded, and
a forge that cannot be reached now must not undo it. Whether it was posted is
itself recorded as an event.
"""

from __future__ import annotations

import logging

from aiworker.core.context import Environment
from aiworker.errors import AiworkerError
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task
from aiworker.store.tasks import append_event

log = logging.getLogger(__name__)
MARK = "<!-- aiworker:notice -->"


def comment_on_issue(env: Environment, db: Database, task_id: int, body: str) -> bool:
    """Post BODY on the task's issue as the worker identity; False when it could not be."""
    with db.read() as session:
        task = session.get(Task, task_id)
        repo = session.get(Repository, task.repository_id) if task else None
        if task is not None and task.issue_number is None and task.parent_id is not None:
            task = session.get(Task, task.parent_id)  # a milestone speaks on its plan's issue
    if task is None or repo is None or task.issue_number is None:
        return False
    try:
        from aiworker.core.forge_access import ForgeAccess

        worker = ForgeAccess(env.loaded).required("worker")
        posted = worker.create_comment(
            repo.owner, repo.name, task.issue_number, f"{env.for_the_forge(body)}\n\n{MARK}"
        )
    except AiworkerError as exc:
        log.warning("task %d: could not comment on the issue: %s", task_id, exc.message)
        with db.write() as session:
            append_event(
                session, "issue.comment_failed", task_id=task_id, data={"reason": exc.message}
            )
        return False
    with db.write() as session:
        append_event(session, "issue.commented", task_id=task_id, data={"comment": posted.id})
    return True
