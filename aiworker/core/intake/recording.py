"""Recording what poll found: a new task, a resumed one, a changed scope, a pause.

Every change goes through advance() against the version poll read, in poll's
write transaction; a task that a phase moved meanwhile refuses, and poll reports
a conflict for it and decides again next time.
"""

from __future__ import annotations

from aiworker.core.tasks.budgets import RELEASE
from aiworker.core.tasks.lifecycle import Refusal, advance, try_advance
from aiworker.core.tasks.states import ACTIVE, RESUMABLE, TaskState
from aiworker.store.discovery import record_coverage
from aiworker.store.engine import Session
from aiworker.store.models import Task
from aiworker.store.task_records import create_task, held_for_operator, paused_from
from aiworker.store.tasks import append_event

TITLE_MAX = 500  # Forgejo's own titles hold 255 characters


def short_title(title: str) -> str:
    """An issue's title as recorded: at most TITLE_MAX characters (a forge that sent a
    megabyte would have every list of tasks repeat it)."""
    return title if len(title) <= TITLE_MAX else title[: TITLE_MAX - 1] + "…"


def record_discovered(
    session: Session,
    repository_id: int,
    kind: str,
    number: int,
    title: str,
    fingerprint: str,
    known: Task | None,
    actor: str | None,
    authorizer: str | None = None,
    item: int | None = None,
    covers: str | None = None,
) -> str:
    """Create, resume or update the task for an authorised issue; say which (or 'unchanged').
    ACTOR authorised it now, with timeline ITEM, covering what its author wrote as COVERS
    (scope.authored); AUTHORIZER is who did so as last recorded: a different writer
    standing behind the work is recorded, so that later polls judge their permission."""
    title = short_title(title)
    if known is None:
        task = create_task(
            session,
            repository_id,
            kind,
            issue_number=number,
            title=title,
            state=TaskState.READY,
            actor=actor,
        )
        advance(
            session,
            task.id,
            TaskState.READY,
            task.version,
            TaskState.READY,
            "scope recorded",
            kind="task.scope_recorded",
            data={"fingerprint": fingerprint},
            scope_fingerprint=fingerprint,
        )
        record_coverage(session, task.id, covers, item)
        return "created"
    record_coverage(session, known.id, covers, item)
    outcome = _update(session, known, title, fingerprint, actor)
    if outcome == "conflict":
        return outcome
    if outcome != "resumed" and actor is not None and actor != authorizer:
        append_event(
            session,
            "task.authorized",
            task_id=known.id,
            actor=actor,
            data={"previous": authorizer},
        )
    return outcome


def _update(session: Session, known: Task, title: str, fingerprint: str, actor: str | None) -> str:
    """'resumed', 'updated', 'unchanged', or 'conflict' when a job moved the task since
    poll read it (poll reads it again next time)."""
    outcome = "unchanged"
    state, version = known.state, known.version
    if state == TaskState.PAUSED and not held_for_operator(session, known.id):
        before = paused_from(session, known.id)
        resume = TaskState(before) if before in RESUMABLE else TaskState.READY
        resumed = try_advance(
            session,
            known.id,
            state,
            version,
            resume,
            "authorised again",
            actor=actor,
            kind="task.resumed",
        )
        if isinstance(resumed, Refusal):
            return "conflict"
        state, version, outcome = resume, resumed, "resumed"
    changed = known.scope_fingerprint != fingerprint or known.title != title
    if changed and state in ACTIVE | {TaskState.PAUSED}:
        # An issue edited while it waited for input is eligible again.
        to_state = TaskState.READY if state == TaskState.NEEDS_INPUT else state
        updated = try_advance(
            session,
            known.id,
            state,
            version,
            to_state,
            "the issue's requirements changed",
            actor=actor,
            kind="task.scope_changed",
            data={"from": known.scope_fingerprint, "to": fingerprint},
            scope_fingerprint=fingerprint,
            title=title,
        )
        if isinstance(updated, Refusal):
            return "conflict"
        outcome = "updated" if outcome == "unchanged" else outcome
    return outcome


def pause_task(session: Session, task: Task, reason: str) -> bool:
    """Pause an active task whose authorisation was withdrawn (or whose issue closed).

    An approved task is left to merge, which re-verifies authorisation itself: its issue
    closes when its PR merges, and a merge that died after the request must still be
    recorded as done."""
    if task.state not in ACTIVE or task.state == TaskState.APPROVED:
        return False
    paused = try_advance(
        session,
        task.id,
        task.state,
        task.version,
        TaskState.PAUSED,
        reason,
        kind="task.paused",
        **RELEASE,
    )
    return not isinstance(paused, Refusal)
