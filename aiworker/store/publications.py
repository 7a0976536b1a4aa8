"""Publications: the intent is saved before any forge request, so a crash is resumable."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from aiworker.store.models import Publication, Repository, Task, utcnow
from aiworker.store.tables import events

OPEN_STATES = ("intent", "pushed", "opened")


def current_publication(session: Session, task_id: int) -> Publication | None:
    return session.scalar(
        select(Publication)
        .where(Publication.task_id == task_id, Publication.state.in_(OPEN_STATES))
        .order_by(Publication.id.desc())
        .limit(1)
    )


def open_pulls(
    session: Session, repository_index: int, states: tuple[str, ...]
) -> dict[int, tuple[int | None, int]]:
    """Of repository REPOSITORY_INDEX's tasks in STATES with an open publication that
    has a pull request: task id -> (its issue's number, its pull request's number)."""
    rows = session.execute(
        select(Task.id, Task.issue_number, Publication.pr_number)
        .join(Publication, Publication.task_id == Task.id)
        .join(Repository, Repository.id == Task.repository_id)
        .where(
            Repository.index == repository_index,
            Task.state.in_(states),
            Publication.state.in_(OPEN_STATES),
            Publication.pr_number.is_not(None),
        )
    ).all()
    return {int(task): (issue, pr) for task, issue, pr in rows if pr is not None}


def save_intent(
    session: Session, task_id: int, intent_id: str, marker: str, branch: str, head: str
) -> Publication:
    publication = Publication(
        task_id=task_id,
        intent_id=intent_id,
        ownership_marker=marker,
        remote_branch=branch,
        head_commit=head,
        state="intent",
    )
    session.add(publication)
    session.flush()
    return publication


def advance_publication(
    session: Session,
    publication_id: int,
    state: str,
    pr_number: int | None = None,
    head: str | None = None,
) -> None:
    """Record that publication PUBLICATION_ID is in STATE (with its pull request
    PR_NUMBER, at HEAD, the commit its branch holds now)."""
    values: dict[str, object] = {"state": state, "updated_at": utcnow()}
    if pr_number is not None:
        values["pr_number"] = pr_number
    if head is not None:
        values["head_commit"] = head
    session.execute(update(Publication).where(Publication.id == publication_id).values(**values))


def close_publication(session: Session, task_id: int, state: str, head: str) -> None:
    """The task's open publication ended in STATE ("merged") at HEAD: no longer open,
    so nothing reads it as the task's pull request to act on."""
    publication = current_publication(session, task_id)
    if publication is not None:
        advance_publication(session, publication.id, state, head=head)


def publications_of(session: Session, task_id: int) -> list[Publication]:
    return list(
        session.scalars(
            select(Publication).where(Publication.task_id == task_id).order_by(Publication.id)
        )
    )


def published_heads(session: Session, task_id: int) -> set[str]:
    """Every head this task pushed: each publication's first, and each publish's (its
    push announced before it is made, its outcome after)."""
    heads = {p.head_commit for p in publications_of(session, task_id) if p.head_commit}
    published = select(events.c.data).where(
        events.c.task_id == task_id, events.c.kind.in_(("publish.pushing", "task.published"))
    )
    for (data,) in session.execute(published):
        if isinstance(data, dict) and data.get("head"):
            heads.add(str(data["head"]))
    return heads
