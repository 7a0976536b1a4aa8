"""`scheduler status`: slots, holders, pause, the last and next check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.report import Report
from aiworker.core.scheduler_state import SchedulerState
from aiworker.core.scheduling.overview import collect_status


@dataclass
class SchedulerStatus(Report):
    paused: bool
    paused_reason: str
    last_check: str | None
    next_deadline: str | None
    check_requested: bool
    slots: list[dict[str, Any]]
    poll_error: str | None
    poll_failures: int


def scheduler_status(env: Environment) -> SchedulerStatus:
    state = SchedulerState.load(env.state_dir)
    overview = collect_status(env).to_json()
    return SchedulerStatus(
        state.paused,
        state.paused_reason,
        state.last_check,
        state.next_deadline,
        state.check_requested,
        overview["slots"],
        state.poll_error,
        state.poll_failures,
    )
