"""Claiming work for a slot under discovery.lock.

A slot's job holds slot-N.lock for as long as it runs, so a claim on a slot
whose lock is free belongs to a dead holder; tasks/recovery.py gives such
claims back (after their grace period) before anything new is claimed.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiworker.core.context import Environment
from aiworker.core.report import Report
from aiworker.core.scheduler_state import DISCOVERY_WAIT_SECONDS, SchedulerState
from aiworker.errors import EXIT_OK, EXIT_UNAVAILABLE, InvalidInput
from aiworker.store.claims import claim_next
from aiworker.store.engine import Database


@dataclass(frozen=True)
class Claim:
    task_id: int
    slot: int
    holder: str


@dataclass
class ClaimReport(Report):
    claimed: bool
    slot: int | None
    task: int | None = None
    holder: str | None = None
    reason: str = ""
    recovered: list[int] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_UNAVAILABLE if self.reason == NO_FREE_SLOT else EXIT_OK


NO_FREE_SLOT = "no free slot"


def claim_for_slot(
    env: Environment, db: Database, slot: int, kinds: Sequence[str], *, unless_paused: bool = False
) -> Claim | None:
    """Under discovery.lock, claim the next eligible task for SLOT (whose lock we hold);
    UNLESS_PAUSED (the tick's claims): none once a pause was acknowledged, which waits
    for the claim under way (scheduler_state.pause)."""
    holder = f"{slot}-{secrets.token_hex(6)}"
    with env.locks.held("discovery", timeout=DISCOVERY_WAIT_SECONDS):
        if unless_paused and SchedulerState.load(env.state_dir).paused:
            return None
        task_id = claim_next(db, slot, holder, kinds)
    return None if task_id is None else Claim(task_id, slot, holder)


def claim_once(env: Environment, slot: int | None) -> ClaimReport:
    """`aiworker claim`: claim the next eligible task for SLOT (or the first free slot)."""
    from aiworker.core.phases.table import claimable_kinds
    from aiworker.core.tasks.recovery import recover_slots

    shares = env.loaded.config.shares
    if slot is not None and not 1 <= slot <= shares:
        raise InvalidInput(f"--slot must be between 1 and shares ({shares})")
    db = env.open_database()
    try:
        for number in [slot] if slot is not None else range(1, shares + 1):
            lock = env.locks.slot(number)
            if not lock.try_acquire():
                continue
            try:
                recovered = [r.task for r in recover_slots(env, db, [number])]
                if _slot_taken(db, number):
                    continue
                claim = claim_for_slot(env, db, number, list(claimable_kinds()))
            finally:
                lock.release()
            if claim is not None:
                return ClaimReport(True, number, claim.task_id, claim.holder, "", recovered)
            return ClaimReport(False, number, reason="no eligible task", recovered=recovered)
    finally:
        db.dispose()
    return ClaimReport(False, slot, reason=NO_FREE_SLOT)


def _slot_taken(db: Database, slot: int) -> bool:
    """A claim still in its grace period keeps its slot: nothing else is claimed there."""
    from aiworker.store.claims import claimed_on

    with db.read_connection() as connection:
        return claimed_on(connection, slot, db.host) is not None
