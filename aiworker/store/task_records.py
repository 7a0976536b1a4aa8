"""Whole task and repository rows as ORM objects, for commands that read or create them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from aiworker.errors import NotFound
from aiworker.store.models import Event, Repository, Task
from aiworker.store.tasks import TASK_KINDS, TASK_STATES, append_event

FORGE_ID = "forge_id"  # where a repository's settings keep the forge's own id of it


def ensure_repository(
    session: Session, index: int, owner: str, name: str, forge_id: int | None = None
) -> Repository:
    """The repository with this stable index; a rename updates owner/name in place.
    FORGE_ID, when given, is recorded as the forge's id of it (core/intake/identity.py)."""
    repo = session.scalar(select(Repository).where(Repository.index == index))
    if repo is not None and forge_id is not None:
        repo.settings = {**(repo.settings or {}), FORGE_ID: forge_id}
    if repo is None:
        settings = {} if forge_id is None else {FORGE_ID: forge_id}
        repo = Repository(index=index, owner=owner, name=name, settings=settings)
        session.add(repo)
        session.flush()
        append_event(session, "repository.added", data={"index": index, "name": f"{owner}/{name}"})
    elif (repo.owner, repo.name) != (owner, name):
        append_event(
            session,
            "repository.renamed",
            data={"index": index, "from": f"{repo.owner}/{repo.name}", "to": f"{owner}/{name}"},
        )
        repo.owner, repo.name = owner, name
    return repo


def create_task(
    session: Session,
    repository_id: int,
    kind: str,
    *,
    issue_number: int | None = None,
    title: str = "",
    state: str = "ready",
    parent_id: int | None = None,
    actor: str | None = None,
    scope_fingerprint: str | None = None,
    spec: dict[str, Any] | None = None,
) -> Task:
    if kind not in TASK_KINDS:
        raise ValueError(f"unknown task kind {kind!r}")
    if state not in TASK_STATES:
        raise ValueError(f"unknown task state {state!r}")
    task = Task(
        repository_id=repository_id,
        kind=kind,
        issue_number=issue_number,
        title=title,
        state=state,
        parent_id=parent_id,
        scope_fingerprint=scope_fingerprint,
        spec=spec,
    )
    session.add(task)
    session.flush()
    append_event(session, "task.created", task_id=task.id, to_state=state, actor=actor)
    return task


def ready_tasks(session: Session, limit: int = 50) -> Sequence[Task]:
    return session.scalars(
        select(Task).where(Task.state == "ready").order_by(Task.id).limit(limit)
    ).all()


def claims_by_slot(session: Session, host: str | None) -> dict[int, Task]:
    """HOST's claims by slot (with those recorded before hosts were)."""
    rows = session.scalars(select(Task).where(Task.claim_slot.is_not(None))).all()
    return {
        t.claim_slot: t for t in rows if t.claim_slot is not None and t.claim_host in (None, host)
    }


def claims_by_host(session: Session) -> dict[str, list[Task]]:
    """Every claim that names its controller, by controller."""
    rows = session.scalars(
        select(Task).where(Task.claim_slot.is_not(None), Task.claim_host.is_not(None))
    ).all()
    found: dict[str, list[Task]] = {}
    for task in rows:
        found.setdefault(str(task.claim_host), []).append(task)
    return found


def latest_event(session: Session, kind: str) -> Event | None:
    return session.scalar(
        select(Event).where(Event.kind == kind).order_by(Event.id.desc()).limit(1)
    )


def task_row(session: Session, task_id: int) -> Task | None:
    return session.get(Task, task_id)


def existing_task(session: Session, task_id: int) -> Task:
    """The task TASK_ID, which must exist (an operator or a job named it)."""
    task = session.get(Task, task_id)
    if task is None:
        raise NotFound(f"no task {task_id}")
    return task


def last_task_event(session: Session, task_id: int) -> Event | None:
    return session.scalar(
        select(Event).where(Event.task_id == task_id).order_by(Event.id.desc()).limit(1)
    )


def last_event_of(session: Session, task_id: int, kind: str) -> Event | None:
    return session.scalar(
        select(Event)
        .where(Event.task_id == task_id, Event.kind == kind)
        .order_by(Event.id.desc())
        .limit(1)
    )


def last_entry_into(session: Session, task_id: int, state: str) -> Event | None:
    """The event that last moved the task into STATE from another state."""
    return session.scalar(
        select(Event)
        .where(
            Event.task_id == task_id,
            Event.to_state == state,
            (Event.from_state.is_(None)) | (Event.from_state != state),
        )
        .order_by(Event.id.desc())
        .limit(1)
    )


def list_tasks(
    session: Session, state: str | None, limit: int, after: int = 0
) -> Sequence[tuple[Task, Repository]]:
    query = (
        select(Task, Repository)
        .join(Repository, Repository.id == Task.repository_id)
        .where(Task.id > after)
    )
    if state is not None:
        query = query.where(Task.state == state)
    return [(t, r) for t, r in session.execute(query.order_by(Task.id).limit(limit))]


def children_of(session: Session, parent_id: int) -> Sequence[Task]:
    """A plan's milestones, in order."""
    return session.scalars(select(Task).where(Task.parent_id == parent_id).order_by(Task.id)).all()


def recent_events(session: Session, limit: int, before: int | None = None) -> Sequence[Event]:
    """The newest events first (older than event BEFORE, when given)."""
    query = select(Event).order_by(Event.id.desc()).limit(limit)
    if before is not None:
        query = query.where(Event.id < before)
    return session.scalars(query).all()


def events_of(session: Session, task_id: int) -> Sequence[Event]:
    return events_of_tasks(session, [task_id])


def events_of_tasks(session: Session, task_ids: Sequence[int]) -> Sequence[Event]:
    """The events of TASK_IDS in the order they were recorded, read in one statement: on
    PostgreSQL one statement is one snapshot, so a later move is never read without an
    earlier one that committed before it."""
    query = select(Event).where(Event.task_id.in_(task_ids)).order_by(Event.id)
    return session.scalars(query).all()


# How a task is paused: by intake (its authorisation was withdrawn; a poll that finds it
# authorised again resumes it) or held for an operator (a restore could not verify it;
# only `task resume` takes it back).
PAUSE_KINDS = ("task.paused", "task.held")


def _last_pause(session: Session, task_id: int) -> tuple[str | None, str | None]:
    row = session.execute(
        select(Event.from_state, Event.kind)
        .where(Event.task_id == task_id, Event.kind.in_(PAUSE_KINDS))
        .order_by(Event.id.desc())
        .limit(1)
    ).first()
    return (None, None) if row is None else (row[0], row[1])


def paused_from(session: Session, task_id: int) -> str | None:
    """The state the task was in when it was last paused (or held)."""
    value = _last_pause(session, task_id)[0]
    return None if value is None else str(value)


def failure(session: Session, task_id: int) -> tuple[str, dict[str, Any]] | None:
    """The state the task was in when it last failed, and what that move recorded."""
    row = session.execute(
        select(Event.from_state, Event.data)
        .where(Event.task_id == task_id, Event.to_state == "failed")
        .order_by(Event.id.desc())
        .limit(1)
    ).first()
    if row is None or row[0] is None:
        return None
    return str(row[0]), dict(row[1] or {})


def held_for_operator(session: Session, task_id: int) -> bool:
    """Whether the task's last pause holds it until an operator resumes it."""
    return _last_pause(session, task_id)[1] == "task.held"


def held_tasks(session: Session, limit: int = 50) -> list[tuple[int, str, datetime]]:
    """The paused tasks whose last pause holds them until an operator resumes them
    (task id, the hold's reason, since when), the oldest first."""
    last = (
        select(Event.task_id, func.max(Event.id).label("id"))
        .join(Task, Task.id == Event.task_id)
        .where(Task.state == "paused", Event.kind.in_(PAUSE_KINDS))
        .group_by(Event.task_id)
        .subquery()
    )
    rows = session.execute(
        select(Event.task_id, Event.data, Event.created_at)
        .join(last, last.c.id == Event.id)
        .where(Event.kind == "task.held")
        .order_by(Event.id)
        .limit(limit)
    ).all()
    return [(int(t), str((data or {}).get("reason", "")), at) for t, data, at in rows]


@dataclass(frozen=True)
class PollCursor:
    since: datetime  # the newest update a poll has judged
    full_at: datetime  # when the last full poll ran


def poll_cursor(session: Session, index: int) -> PollCursor | None:
    """Where the last poll of the repository with this index left off."""
    repo = session.scalar(select(Repository).where(Repository.index == index))
    cursor = (repo.settings or {}).get("poll") if repo else None
    if not cursor or not cursor.get("since") or not cursor.get("full_at"):
        return None
    return PollCursor(
        datetime.fromisoformat(cursor["since"]),
        datetime.fromisoformat(cursor["full_at"]),
    )


def record_poll(
    session: Session,
    repo: Repository,
    listed: Sequence[tuple[int, datetime]],
    full_at: datetime | None,
    cap: datetime | None = None,
) -> None:
    """Advance the cursor to the newest of the issues LISTED (number, updated_at). Forgejo's
    since= is inclusive and counts whole seconds, so the issues of that second are listed
    (and judged) again next time: a change made later within it shows in nothing else."""
    cursor = dict((repo.settings or {}).get("poll") or {})
    cursor.pop("judged", None)  # digests an earlier version kept; nothing reads them
    newest = max((at for _, at in listed), default=None)
    since = datetime.fromisoformat(cursor["since"]) if cursor.get("since") else None
    if newest is not None and (since is None or newest >= since):
        cursor["since"] = newest.isoformat()
    elif since is None and cap is not None:
        # Nothing listed yet: start from a little before this poll (CAP), by this host's
        # clock, which may run ahead of the forge's.
        cursor["since"] = cap.isoformat()
    if full_at is not None:
        cursor["full_at"] = full_at.isoformat()
    if cursor != (repo.settings or {}).get("poll"):
        settings = {**(repo.settings or {}), "poll": cursor}
        session.execute(
            update(Repository).where(Repository.id == repo.id).values(settings=settings)
        )
