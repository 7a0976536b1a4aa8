"""Budgets: how many attempts a task's phase may spend, and what happens when they run out.

The counts live in the database (store/budgets.py), charged when an attempt
starts and refunded only for a quota failure; an abandoned attempt counts. An
exhausted budget ends the task as failed with a comment on its issue that lists
every attempt and why it ended.
"""

from __future__ import annotations

from typing import Any

from aiworker.core.context import Environment
from aiworker.core.tasks.lifecycle import Refusal, try_advance
from aiworker.core.tasks.notices import comment_on_issue
from aiworker.core.tasks.states import HOLDS_SLOT, TaskState
from aiworker.store.attempts import attempts_of
from aiworker.store.budgets import used
from aiworker.store.engine import Database

RELEASE: dict[str, Any] = {
    "claim_slot": None,
    "claim_token": None,
    "claim_host": None,
    "claimed_at": None,
}


def limit(env: Environment, phase: str) -> int:
    return env.loaded.config.budgets.limit(phase)


def spent(env: Environment, db: Database, task_id: int, phase: str) -> tuple[int, int]:
    """(used, limit) of TASK_ID's budget for PHASE."""
    with db.read() as session:
        return used(session, task_id, phase), limit(env, phase)


def budget_spent(env: Environment, db: Database, task_id: int, phase: str) -> str | None:
    """Why no attempt of PHASE may start (its budget is spent), or None when one may."""
    used_now, allowed = spent(env, db, task_id, phase)
    if used_now < allowed:
        return None
    return f"no {phase} attempts left ({used_now} of {allowed} used)"


def attempts_summary(db: Database, task_id: int) -> str:
    with db.read() as session:
        rows = attempts_of(session, task_id)
        lines = [
            f"- attempt {a.id} ({a.phase}, {a.provider or 'host'}): {a.outcome or 'open'}"
            + (" (refunded)" if a.refunded else "")
            + (f": {a.reason}" if a.reason else "")
            for a in rows
        ]
    return "\n".join(lines) or "- no attempt was recorded"


def land_after_failure(
    env: Environment,
    db: Database,
    task_id: int,
    state: str,
    version: int,
    phase: str,
    reason: str,
    *,
    retry_state: str,
) -> str | None:
    """After a failed or abandoned attempt of PHASE: RETRY_STATE while the budget lasts,
    else failed with a comment. Returns the state landed in, or None when the task had
    moved on meanwhile (paused, cancelled): then it is left as it is."""
    count, allowed = spent(env, db, task_id, phase)
    exhausted = count >= allowed
    target = TaskState.FAILED if exhausted else retry_state
    final = target == TaskState.FAILED
    changes = RELEASE if state in HOLDS_SLOT else {}
    why = f"{phase} budget spent ({count} of {allowed}): {reason}" if exhausted else reason
    with db.write() as session:
        moved = try_advance(
            session,
            task_id,
            state,
            version,
            target,
            why,
            actor=phase,
            kind="task.failed" if final else "task.retry_scheduled",
            data={"phase": phase, "used": count, "limit": allowed},
            follow_data_changes=True,
            **changes,
        )
    if isinstance(moved, Refusal):
        return None
    if final:
        why = (
            f"the {phase} budget of {allowed} attempts is spent"
            if exhausted
            else f"the {phase} attempt failed in a way another try would not fix"
        )
        comment_on_issue(
            env,
            db,
            task_id,
            f"aiworker stopped working on this: {why}. Last failure: {reason}\n\n"
            f"Attempts:\n{attempts_summary(db, task_id)}\n\n"
            "An operator can run `aiworker task retry` once the cause is fixed.",
        )
    return str(target)
