"""Claiming work for a slot under discovery.lock, and recovering claims whose holder died.

A slot's job holds slot-N.lock for as long as it runs, so a claim on a slot
whose lock is free belongs to a dead holder. A fresh claim gets a short grace,
so the hand-over from the scheduler to the slot's process is never mistaken
for a death.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from aiworker.core.context import Environment
from aiworker.errors import InvalidInput
from aiworker.store.engine import Database
from aiworker.store.tasks import active_claims, claim_next, release_claim

log = logging.getLogger(__name__)
HANDOVER_GRACE = timedelta(seconds=60)
DISCOVERY_WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class Claim:
    task_id: int
    slot: int
    holder: str


def recover_stale_claims(
    env: Environment, db: Database, own_slots: Sequence[int] = (), now: datetime | None = None
) -> list[int]:
    """Release claims whose slot lock is free; OWN_SLOTS are locked by us but not yet used."""
    now = now or datetime.now(UTC)
    recovered = []
    with db.transaction() as conn:
        for row in active_claims(conn):
            if row.state not in ("claimed", "running"):
                continue
            ours = row.slot in own_slots
            if not ours and env.locks.slot(row.slot).is_locked():
                continue
            if not ours and row.claimed_at and now - row.claimed_at < HANDOVER_GRACE:
                continue
            reason = f"slot {row.slot} lock free: holder {row.token} is gone"
            if release_claim(conn, row.id, row.version, row.state, reason):
                recovered.append(int(row.id))
                log.warning("recovered stale claim of task %d on slot %d", row.id, row.slot)
    return recovered


def claim_for_slot(env: Environment, db: Database, slot: int, kinds: Sequence[str]) -> Claim | None:
    """Under discovery.lock, claim the next eligible task for SLOT (whose lock we hold)."""
    holder = f"{slot}-{secrets.token_hex(6)}"
    with env.locks.held("discovery", timeout=DISCOVERY_WAIT_SECONDS):
        task_id = claim_next(db, slot, holder, kinds)
    return None if task_id is None else Claim(task_id, slot, holder)


def claim_once(env: Environment, slot: int | None) -> dict[str, object]:
    """`aiworker claim`: claim the next eligible task for SLOT (or the first free slot)."""
    from aiworker.core.scheduling.phase_commands import NEXT_PHASE

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
                recovered = recover_stale_claims(env, db, [number])
                claim = claim_for_slot(env, db, number, list(NEXT_PHASE))
            finally:
                lock.release()
            if claim is not None:
                return {
                    "claimed": True,
                    "task": claim.task_id,
                    "slot": number,
                    "holder": claim.holder,
                    "recovered": recovered,
                }
            return {
                "claimed": False,
                "slot": number,
                "reason": "no eligible task",
                "recovered": recovered,
            }
    finally:
        db.dispose()
    return {"claimed": False, "slot": slot, "reason": "no free slot"}
