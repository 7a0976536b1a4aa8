"""What a restore reads of the restored store: the payloads its records name, and each
task that has not ended with what the forge must still agree with."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from aiworker.store.publications import OPEN_STATES
from aiworker.store.tables import publications, repositories, tasks

ENDED = ("done", "failed", "cancelled")


@dataclass(frozen=True)
class TaskToVerify:
    id: int
    state: str
    version: int
    kind: str
    repository: int  # its index in the configuration
    owner: str
    name: str
    issue: int | None
    head: str | None
    pr: int | None  # of its open publication, when it has one


def tasks_to_verify(session: Session) -> list[TaskToVerify]:
    rows = session.execute(
        select(
            tasks.c.id,
            tasks.c.state,
            tasks.c.version,
            tasks.c.kind,
            repositories.c.index,
            repositories.c.owner,
            repositories.c.name,
            tasks.c.issue_number,
            tasks.c.head_commit,
        )
        .join(repositories, repositories.c.id == tasks.c.repository_id)
        .where(tasks.c.state.not_in(ENDED))
        .order_by(tasks.c.id)
    ).all()
    prs = dict(
        session.execute(
            select(publications.c.task_id, publications.c.pr_number)
            .where(publications.c.state.in_(OPEN_STATES), publications.c.pr_number.is_not(None))
            .order_by(publications.c.id)
        ).all()
    )
    return [TaskToVerify(*row, pr=prs.get(row[0])) for row in rows]
