"""Receipts: evidence bound to (phase, head, base, scope) and full commit hashes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from aiworker.store.models import Receipt


def add_receipt(
    session: Session,
    *,
    task_id: int | None,
    phase: str,
    head: str,
    base: str,
    scope: str | None,
    check_id: str | None,
    outcome: str,
    body: dict[str, Any],
) -> int:
    receipt = Receipt(
        task_id=task_id,
        phase=phase,
        head_commit=head,
        base_commit=base,
        scope_fingerprint=scope,
        check_id=check_id,
        outcome=outcome,
        body=body,
    )
    session.add(receipt)
    session.flush()
    return receipt.id


def receipts_for(session: Session, task_id: int | None, phase: str) -> Sequence[Receipt]:
    return session.scalars(
        select(Receipt)
        .where(Receipt.task_id == task_id, Receipt.phase == phase)
        .order_by(Receipt.id)
    ).all()


def receipts_of(session: Session, task_id: int) -> Sequence[Receipt]:
    return session.scalars(
        select(Receipt).where(Receipt.task_id == task_id).order_by(Receipt.id)
    ).all()


def get_receipt(session: Session, receipt_id: int) -> Receipt | None:
    return session.get(Receipt, receipt_id)
