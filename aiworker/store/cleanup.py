"""The cleanup inventory: what was removed after delivery, and what was kept."""

from __future__ import annotations

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from aiworker.store.models import CleanupItem, Task


def record_cleanup(
    session: Session, task_id: int, path: str, action: str, reason: str, size: int | None
) -> None:
    session.execute(
        insert(CleanupItem).values(
            task_id=task_id, path=path, action=action, reason=reason, bytes=size
        )
    )


def delivered_task_ids(session: Session) -> list[int]:
    return [int(t) for t in session.scalars(select(Task.id).where(Task.state == "done"))]
