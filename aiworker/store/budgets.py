"""Budgets: attempts and repair episodes used per task and phase.

A charge is made in the transaction that starts the attempt, a refund in the one
that finishes it (a quota failure); an operator's retry resets what was used and
counts the reset. The rows outlive processes, polls and restarts.
"""

from __future__ import annotations

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from aiworker.store.models import Budget, utcnow


def _row(session: Session, task_id: int, phase: str) -> Budget:
    row = session.scalar(select(Budget).where(Budget.task_id == task_id, Budget.phase == phase))
    if row is None:
        session.execute(insert(Budget).values(task_id=task_id, phase=phase, used=0, resets=0))
        row = session.scalar(select(Budget).where(Budget.task_id == task_id, Budget.phase == phase))
        assert row is not None
    return row


def used(session: Session, task_id: int, phase: str) -> int:
    value = session.scalar(
        select(Budget.used).where(Budget.task_id == task_id, Budget.phase == phase)
    )
    return int(value or 0)


def charge(session: Session, task_id: int, phase: str) -> int:
    """Count one more attempt of PHASE; return how many are used now."""
    row = _row(session, task_id, phase)
    session.execute(
        update(Budget).where(Budget.id == row.id).values(used=Budget.used + 1, updated_at=utcnow())
    )
    return used(session, task_id, phase)


def refund(session: Session, task_id: int, phase: str) -> None:
    session.execute(
        update(Budget)
        .where(Budget.task_id == task_id, Budget.phase == phase, Budget.used > 0)
        .values(used=Budget.used - 1, updated_at=utcnow())
    )


def reset(session: Session, task_id: int) -> dict[str, int]:
    """Set every phase's use back to zero (an operator's retry); return what was used."""
    rows = session.scalars(select(Budget).where(Budget.task_id == task_id)).all()
    before = {row.phase: row.used for row in rows}
    session.execute(
        update(Budget)
        .where(Budget.task_id == task_id)
        .values(used=0, resets=Budget.resets + 1, updated_at=utcnow())
    )
    return before


def budgets_of(session: Session, task_id: int) -> dict[str, dict[str, int]]:
    rows = session.scalars(
        select(Budget).where(Budget.task_id == task_id).order_by(Budget.phase)
    ).all()
    return {row.phase: {"used": row.used, "resets": row.resets} for row in rows}
