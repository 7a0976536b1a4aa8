"""The scheduler's small persistent state: pause, pending check requests, the last check."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiworker.core.report import Report
from aiworker.errors import InvalidInput, LockHeld
from aiworker.humanize import one_line
from aiworker.runtime.atomic import write_private_file
from aiworker.runtime.clocks import mark

if TYPE_CHECKING:
    from aiworker.core.context import Environment


MAX_STATE_BYTES = 64 * 1024
PAUSE_REASON_MAX = 500  # characters; the web's pause takes as many
DISCOVERY_WAIT_SECONDS = 30.0  # for discovery.lock, which a claim holds a moment
POLL_ERROR_MAX = 2000  # characters kept of a poll's error: the state stays far below its size


@dataclass
class SchedulerState:
    paused: bool = False
    paused_reason: str = ""
    paused_by: str = ""  # who paused: a login and where from ("alice (command line)")
    paused_at: str | None = None
    check_requested: bool = False
    check_requested_at: str | None = None  # the latest request's time (ISO, UTC)
    last_check: str | None = None
    # The last check's moment by the wall clock and real time (runtime/clocks.Mark), by
    # which a later look tells whether the wall clock stepped since.
    checked_mark: list[Any] | None = None
    next_deadline: str | None = None
    # The last poll's failure (None after a poll that worked) and how many in a row failed.
    poll_error: str | None = None
    poll_error_at: str | None = None
    poll_failures: int = 0
    poll_exit: int = 0  # how the failing poll exited: the ticks between checks exit so too

    @staticmethod
    def path(state_dir: Path) -> Path:
        return state_dir / "scheduler.json"

    @classmethod
    def load(cls, state_dir: Path) -> SchedulerState:
        """The state as saved; none saved yet: the default (running). One that cannot be
        read stops new work, saying so: it may have said paused."""
        path = cls.path(state_dir)
        try:
            with path.open("rb") as handle:
                data = json.loads(handle.read(MAX_STATE_BYTES))  # what save() writes is small
        except (FileNotFoundError, NotADirectoryError):
            return cls()
        except (UnicodeDecodeError, json.JSONDecodeError):
            data = None
        if isinstance(data, dict):
            with contextlib.suppress(TypeError):
                return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        why = f"{path} cannot be read; `aiworker scheduler resume` writes it anew"
        return cls(paused=True, paused_reason=why, paused_by="aiworker", paused_at=_stamp())

    def save(self, state_dir: Path) -> None:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.paused_reason = self.paused_reason[:PAUSE_REASON_MAX]
        self.poll_error = self.poll_error[:POLL_ERROR_MAX] if self.poll_error else self.poll_error
        write_private_file(self.path(state_dir), json.dumps(asdict(self)).encode())

    def due(self, interval: int, now: datetime) -> bool:
        """A check is due: asked for, never made, INTERVAL seconds after the last, or
        the last is in the future: the clock was set back since, and waiting for it
        would stop every check for as long as the step (this one sets a new mark)."""
        if self.check_requested or not self.last_check:
            return True
        try:
            last = datetime.fromisoformat(self.last_check)
        except ValueError:
            return True
        return now >= last + timedelta(seconds=interval) or last > now

    def overdue(self, interval: int, now: datetime) -> bool:
        """The last check is older than twice INTERVAL: the timer is probably not running."""
        last = self.last_check_at()
        return last is not None and now - last > timedelta(seconds=2 * interval)

    def last_check_at(self) -> datetime | None:
        try:
            return datetime.fromisoformat(self.last_check) if self.last_check else None
        except ValueError:
            return None


@dataclass
class PauseReport(Report):
    paused: bool
    reason: str
    paused_by: str
    paused_at: str | None
    already: bool  # paused before: that pause stands
    # A tick's claim outlasted the wait: it may claim once more before it reads the pause.
    pending: str | None = None

    def said(self) -> str:
        pending = f"; {self.pending}" if self.pending else ""
        if not self.already:
            return f"scheduler paused{pending}"
        why = f" ({self.reason})" if self.reason else ""
        stands = f"already paused by {self.paused_by} since {self.paused_at}{why}"
        return f"{stands}; that pause stands{pending}"


def pause(env: Environment, reason: str, by: str) -> PauseReport:
    """Stop starting new work; status says why, who paused and since when. REASON is one
    line of text: a line break or control character would forge status lines or reach
    the operator's terminal as an escape sequence. A pause while paused leaves the first
    standing (its reason, who and since when)."""
    if one_line(reason) != reason:  # a control, a line separator, a bidi override
        raise InvalidInput("the pause reason must be one line without control characters")
    if len(reason) > PAUSE_REASON_MAX:
        raise InvalidInput(
            f"the pause reason is {len(reason)} characters long; at most {PAUSE_REASON_MAX}"
        )
    with _changing(env) as state:
        already = state.paused
        if not already:
            state.paused, state.paused_reason = True, reason
            state.paused_by, state.paused_at = by, _stamp()
    # Said once no tick's claim is under way: a tick claims under discovery.lock and reads
    # the pause there, so that nothing is claimed after the pause is acknowledged.
    pending = None
    try:
        with env.locks.held("discovery", DISCOVERY_WAIT_SECONDS):
            pass
    except LockHeld:
        pending = (
            f"a tick has claimed for over {DISCOVERY_WAIT_SECONDS:g} s (a slow forge?): it "
            "may start one more job before it reads the pause"
        )
    report = PauseReport(True, state.paused_reason, state.paused_by, state.paused_at, already)
    report.pending = pending
    return report


def resume(env: Environment) -> SchedulerState:
    return update_state(env, paused=False, paused_reason="", paused_by="", paused_at=None)


def login() -> str:
    """This process's user, as status names who paused from the command line."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def request_check(env: Environment) -> SchedulerState:
    """Ask for a check now: the next tick (the timer's --if-due, or one started for it)
    makes it, even when a tick that began before this request is still running."""
    return update_state(env, check_requested=True, check_requested_at=_stamp())


def record_check(
    env: Environment, began: str, checked: str, next_deadline: str | None
) -> SchedulerState:
    """A tick that began at BEGAN checked at CHECKED: a request made before it began is
    answered; one made while it ran stays (the tick may have passed what it was about)."""
    with _changing(env) as state:
        asked = state.check_requested_at
        state.check_requested = bool(state.check_requested and asked and asked > began)
        state.last_check, state.next_deadline = checked, next_deadline
        state.checked_mark = list(mark())
    return state


def _stamp() -> str:
    return datetime.now(UTC).isoformat()


@contextmanager
def _changing(env: Environment) -> Iterator[SchedulerState]:
    """The scheduler's state, saved as the block left it, under its lock."""
    env.ensure_state_dir()  # named when unusable, before its locks are made there
    with env.locks.held("scheduler-state", timeout=10):
        state = SchedulerState.load(env.state_dir)
        yield state
        state.save(env.state_dir)


def update_state(env: Environment, **changes: Any) -> SchedulerState:
    """Change the scheduler's state under its lock (pause, resume, check requests)."""
    with _changing(env) as state:
        for key, value in changes.items():
            setattr(state, key, value)
    return state


def record_poll(
    env: Environment, error: str | None, when: datetime, exit_code: int = 0
) -> SchedulerState:
    """A poll's outcome, for status and doctor: its error (None when it worked), how it
    exited, and how many polls in a row have failed."""
    with _changing(env) as state:
        state.poll_failures = state.poll_failures + 1 if error else 0
        state.poll_error = error
        state.poll_error_at = when.isoformat() if error else None
        state.poll_exit = exit_code if error else 0
    return state
