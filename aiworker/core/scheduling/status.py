"""`scheduler status`: slots, holders, pause, the last and next check."""

from __future__ import annotations

from typing import Any

from aiworker.core.context import Environment
from aiworker.core.scheduling.overview import collect_status
from aiworker.core.scheduling.state import SchedulerState


def scheduler_status(env: Environment) -> dict[str, Any]:
    state = SchedulerState.load(env.state_dir)
    overview = collect_status(env).as_dict()
    return {
        "paused": state.paused,
        "paused_reason": state.paused_reason,
        "last_check": state.last_check,
        "next_deadline": state.next_deadline,
        "check_requested": state.check_requested,
        "slots": overview["slots"],
    }
