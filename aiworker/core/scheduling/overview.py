"""The operator's overview: tasks by state, slots and the last check."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.guests.backends import isolation_refusal
from aiworker.core.maintenance.retention import store_summary
from aiworker.core.maintenance.storage import space_shortage
from aiworker.core.report import Report
from aiworker.core.scheduler_state import SchedulerState
from aiworker.store.controllers import last_seen, server_now
from aiworker.store.engine import Session
from aiworker.store.task_records import claims_by_host, claims_by_slot, held_tasks, latest_event
from aiworker.store.tasks import TASK_STATES, count_by_state

CHECK_EVENT = "scheduler.check"


@dataclass(frozen=True)
class SlotStatus:
    slot: int
    busy: bool
    holder_pid: int | None
    task_id: int | None
    task_state: str | None


@dataclass
class StatusReport(Report):
    tasks: dict[str, int]
    slots: list[SlotStatus] = field(default_factory=list)
    last_check: datetime | None = None
    # The last poll's failure (None when it worked) and how many polls in a row failed.
    poll_error: str | None = None
    poll_failures: int = 0
    # Configured providers that cannot run for want of isolation: provider -> why, and the fix.
    isolation: dict[str, str] = field(default_factory=dict)
    scheduler: dict[str, Any] = field(default_factory=dict)
    # The artifact store: payloads, bytes, and what the next retention pass removes.
    artifacts: dict[str, int] = field(default_factory=dict)
    # This host, and every controller sharing the database with its last sign of life
    # and the claims it holds.
    controller: str = ""
    controllers: list[dict[str, Any]] = field(default_factory=list)
    # Why no new work starts for want of space (under storage.reserve_gib), or None.
    low_space: str | None = None
    # Tasks held until an operator resumes them: task, reason, since.
    held: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "scheduler": self.scheduler,
            "tasks": self.tasks,
            "total_tasks": sum(self.tasks.values()),
            "slots": [vars(s) for s in self.slots],
            "last_check": self.last_check.isoformat() if self.last_check else None,
            "poll_error": self.poll_error,
            "poll_failures": self.poll_failures,
            "isolation": self.isolation,
            "artifacts": self.artifacts,
            "controller": self.controller,
            "controllers": self.controllers,
            "low_space": self.low_space,
            "held": self.held,
        }


def collect_status(env: Environment) -> StatusReport:
    db = env.open_database()
    try:
        with db.read() as session:
            counts = count_by_state(session)
            claims = claims_by_slot(session, db.host)
            check = latest_event(session, CHECK_EVENT)
            last_check = check.created_at if check else None
            controllers = _controllers(session)
            held = [
                {"task": task, "reason": reason, "since": since.isoformat()}
                for task, reason, since in held_tasks(session)
            ]
        artifacts = store_summary(env, db)
    finally:
        db.dispose()
    tasks = {state: counts.get(state, 0) for state in TASK_STATES}
    slots = []
    for number in range(1, env.loaded.config.shares + 1):
        lock = env.locks.slot(number)
        claimed = claims.get(number)
        slots.append(
            SlotStatus(
                slot=number,
                busy=lock.is_locked(),
                holder_pid=lock.holder_pid(),
                task_id=claimed.id if claimed else None,
                task_state=claimed.state if claimed else None,
            )
        )
    state = SchedulerState.load(env.state_dir)
    refused = {name: isolation_refusal(env, name) for name in env.loaded.config.providers}
    isolation = {str(name): why for name, why in refused.items() if why}
    summary = scheduler_summary(state, env.loaded.config.check_interval, datetime.now(UTC))
    return StatusReport(
        tasks,
        slots,
        last_check,
        state.poll_error,
        state.poll_failures,
        isolation,
        summary,
        artifacts,
        env.controller_id,
        controllers,
        space_shortage(env),
        held,
    )


def _controllers(session: Session) -> list[dict[str, Any]]:
    """Each controller seen (or holding a claim), its last sign of life and its claims."""
    seen = last_seen(session.connection())
    now = server_now(session.connection())  # the clock signs of life are written by
    held = claims_by_host(session)
    return [
        {
            "id": host,
            "seen_at": seen[host].at.isoformat() if host in seen else None,
            "seen_age_s": int((now - seen[host].at).total_seconds()) if host in seen else None,
            "claims": [
                {"task": t.id, "slot": t.claim_slot, "state": t.state} for t in held.get(host, [])
            ],
        }
        for host in sorted(set(seen) | set(held))
    ]


def scheduler_summary(state: SchedulerState, interval: int, now: datetime) -> dict[str, Any]:
    """Why work moves or not: paused (why, by whom, since), the last check and whether
    it is overdue, the next one, and the polls' failures."""
    last = state.last_check_at()
    if state.paused:
        next_check = None  # a paused scheduler starts nothing
    elif state.check_requested or last is None or state.due(interval, now):
        next_check = now.isoformat()
    else:
        next_check = max(now, last + timedelta(seconds=interval)).isoformat()
    return {
        "paused": state.paused,
        "paused_reason": state.paused_reason,
        "paused_by": state.paused_by,
        "paused_at": state.paused_at,
        "last_check": state.last_check,
        "last_check_age_s": int((now - last).total_seconds()) if last else None,
        "overdue": state.overdue(interval, now),
        "check_interval_s": interval,
        "check_requested": state.check_requested,
        "next_check": next_check,
        "poll_error": state.poll_error,
        "poll_error_at": state.poll_error_at,
        "poll_failures": state.poll_failures,
    }
