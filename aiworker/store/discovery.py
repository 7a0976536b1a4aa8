"""Reading the tasks poll compares the forge against."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from aiworker.store.models import Task


def tasks_of(session: Session, repository_id: int) -> dict[tuple[str, int], Task]:
    rows = session.scalars(
        select(Task).where(Task.repository_id == repository_id, Task.issue_number.is_not(None))
    ).all()
    return {(t.kind, t.issue_number): t for t in rows if t.issue_number is not None}
