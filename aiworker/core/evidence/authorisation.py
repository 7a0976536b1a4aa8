"""Which receipts authorise publishing or merging a head: passing ones, one for every
required check, for exactly that head, base and issue scope (the gate writes them)."""

from __future__ import annotations

from typing import Any

from aiworker.core.evidence.requirements import Requirement
from aiworker.store.engine import Database
from aiworker.store.models import Task
from aiworker.store.receipts import receipts_for

PHASE = "validation"  # the gate's receipts and attempts


def checked_at_head(db: Database, task: Task, requirements: list[Requirement]) -> tuple[bool, str]:
    """publication_allowed for TASK at the head, base and scope it records (a task that
    records none has no receipts for it)."""
    return publication_allowed(
        db,
        task.id,
        head=str(task.head_commit),
        base=str(task.base_commit),
        scope=task.scope_fingerprint,
        requirements=requirements,
    )


def publication_allowed(
    db: Database,
    task_id: int | None,
    *,
    head: str,
    base: str,
    scope: str | None,
    requirements: list[Requirement],
) -> tuple[bool, str]:
    """Only passing receipts for exactly this head, base and scope authorise publication."""
    with db.read() as session:
        receipts = receipts_for(session, task_id, PHASE)
        latest: dict[str, Any] = {}
        for receipt in receipts:
            if (receipt.head_commit, receipt.base_commit, receipt.scope_fingerprint) == (
                head,
                base,
                scope,
            ):
                latest[receipt.check_id or ""] = receipt.outcome
    for requirement in requirements:
        outcome = latest.get(requirement.check_id)
        if outcome is None:
            return False, (
                f"no receipt for check {requirement.check_id} at head {head[:12]} "
                f"on base {base[:12]} (missing or stale evidence)"
            )
        if outcome != "pass":
            return False, f"check {requirement.check_id} failed at head {head[:12]}"
    return True, "every required check passed at this exact head and base"
