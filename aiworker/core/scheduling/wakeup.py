"""The timer's wake-up, kept light: the timer wakes the tick every few seconds, and the
tick checks only once check_interval has passed since the last check or a check was
asked for. The interval is read from the configuration at every wake-up, so a changed
interval takes effect without touching the timer; deciding that a wake-up has nothing
to do imports neither the store nor the configuration's models."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiworker.config.defaults import CHECK_INTERVAL, CONFIG_MAX_BYTES, MIN_CHECK_INTERVAL
from aiworker.core.report import Report
from aiworker.core.scheduler_state import SchedulerState
from aiworker.errors import EXIT_OK


@dataclass
class TickReport(Report):
    status: str = "checked"  # checked | paused | not_due
    poll: dict[str, Any] | None = None
    poll_error: str | None = None
    recovered: list[dict[str, Any]] = field(default_factory=list)
    started: list[dict[str, Any]] = field(default_factory=list)
    busy_slots: list[int] = field(default_factory=list)
    delivering: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    cleaned: list[dict[str, Any]] = field(default_factory=list)
    guests_swept: list[str] = field(default_factory=list)
    next_deadline: str | None = None
    # What the hourly retention pass removed, when this tick ran it.
    retention: dict[str, int] | None = None
    low_space: str | None = None  # why nothing new started: under storage.reserve_gib
    expired: list[dict[str, Any]] = field(default_factory=list)  # ended at their deadline
    stuck: list[dict[str, Any]] = field(default_factory=list)  # jobs stopped long after it
    # How the failed poll would have exited (the tick did the rest and exits so: 2 when the
    # operator must act, so that its unit shows failed; 75 for an outage).
    poll_exit: int = field(default=EXIT_OK, metadata={"internal": True})

    @property
    def exit_code(self) -> int:
        return self.poll_exit


def not_due(state_dir: Path, config_path: Path, required: bool) -> TickReport | None:
    """A report that no check is due yet, or None when one is due now (or the interval
    cannot be read lightly: the full tick then reads the configuration and says what is
    wrong with it)."""
    interval = _configured_interval(config_path, required)
    state = SchedulerState.load(state_dir)
    now = datetime.now(UTC)
    if interval is None or state.due(interval, now) or state.last_check is None:
        return None
    following = datetime.fromisoformat(state.last_check) + timedelta(seconds=interval)
    # The last poll's failure stands until the next check: a wake-up between checks exits
    # as it did, so that the unit stays failed while the operator must act.
    return TickReport(
        status="not_due",
        next_deadline=following.isoformat(),
        poll_error=state.poll_error,
        poll_exit=state.poll_exit if state.poll_error else EXIT_OK,
    )


def _configured_interval(path: Path, required: bool) -> int | None:
    try:
        with path.open("rb") as handle:
            raw = handle.read(CONFIG_MAX_BYTES + 1)
        data = tomllib.loads(raw.decode()) if len(raw) <= CONFIG_MAX_BYTES else None
    except FileNotFoundError:
        return None if required else CHECK_INTERVAL
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    if data is None:
        return None  # the full tick reads it and says what is wrong
    value = data.get("check_interval", CHECK_INTERVAL)
    return value if type(value) is int and value >= MIN_CHECK_INTERVAL else None
