"""Reading the tasks poll compares the forge against, and what their authorisation covers."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from aiworker.store.models import Event, Repository, Task

# The events that name who authorised a task's work: discovery, a resumption by a poll
# that found it authorised again, and a poll that found a different writer's label or
# assignment standing behind it. An operator's `task resume` authorises nothing on the
# forge (it was recorded as task.resumed by "operator" before 2026-12).
AUTHORIZING = ("task.created", "task.resumed", "task.authorized")
OPERATOR_RESUME = ("task.resumed", "operator")


def tasks_of(session: Session, repository_id: int) -> dict[tuple[str, int], Task]:
    rows = session.scalars(
        select(Task).where(Task.repository_id == repository_id, Task.issue_number.is_not(None))
    ).all()
    return {(t.kind, t.issue_number): t for t in rows if t.issue_number is not None}


Coverage = tuple[str | None, int | None]  # an authorised scope, and its timeline item


def coverage_of(session: Session, index: int) -> dict[int, Coverage]:
    """For each issue of the repository with configuration INDEX: what its authorisation
    covers as recorded (on each of its tasks alike; record_coverage)."""
    rows = session.execute(
        select(Task.issue_number, Task.authorized_scope, Task.authorized_item)
        .join(Repository, Repository.id == Task.repository_id)
        .where(
            Repository.index == index,
            Task.issue_number.is_not(None),
            Task.authorized_scope.is_not(None),
        )
        .order_by(Task.id)
    )
    return {int(n): (scope, item) for n, scope, item in rows if n is not None}


def record_coverage(session: Session, task_id: int, scope: str | None, item: int | None) -> None:
    """What the authorisation of TASK_ID's issue covers now, recorded on every task of
    that issue (a task of another kind on it stands on the same text). No task moves:
    their versions stay."""
    issue = select(Task.repository_id, Task.issue_number).where(Task.id == task_id).subquery()
    session.execute(
        update(Task)
        .where(
            Task.repository_id == issue.c.repository_id,
            Task.issue_number == issue.c.issue_number,
            or_(
                Task.authorized_scope.is_distinct_from(scope),
                Task.authorized_item.is_distinct_from(item),
            ),
        )
        .values(authorized_scope=scope, authorized_item=item)
        .execution_options(synchronize_session=False)
    )


def authorizers(session: Session, task_ids: Iterable[int]) -> dict[int, str]:
    """Who authorised each task's work, as last recorded (tasks without one are left out)."""
    ids = list(task_ids)
    if not ids:
        return {}
    latest = (
        select(func.max(Event.id))
        .where(
            Event.task_id.in_(ids),
            Event.kind.in_(AUTHORIZING),
            Event.actor.is_not(None),
            ~and_(Event.kind == OPERATOR_RESUME[0], Event.actor == OPERATOR_RESUME[1]),
        )
        .group_by(Event.task_id)
    )
    rows = session.execute(select(Event.task_id, Event.actor).where(Event.id.in_(latest)))
    return {int(task_id): str(actor) for task_id, actor in rows if task_id is not None}


def repository_at(session: Session, index: int) -> Repository | None:
    """The recorded repository with the configuration's INDEX (None before its first poll)."""
    return session.scalar(select(Repository).where(Repository.index == index))
