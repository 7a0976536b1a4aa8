"""The scheduler's small persistent state: pause, pending check requests, the last check."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiworker.core.context import Environment
from aiworker.runtime.atomic import write_private_file


@dataclass
class SchedulerState:
    paused: bool = False
    paused_reason: str = ""
    check_requested: bool = False
    last_check: str | None = None
    next_deadline: str | None = None

    @staticmethod
    def path(state_dir: Path) -> Path:
        return state_dir / "scheduler.json"

    @classmethod
    def load(cls, state_dir: Path) -> SchedulerState:
        try:
            data: dict[str, Any] = json.loads(cls.path(state_dir).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return cls()
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def save(self, state_dir: Path) -> None:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private_file(self.path(state_dir), json.dumps(asdict(self)).encode())


def update_state(env: Environment, **changes: Any) -> SchedulerState:
    """Change the scheduler's state under its lock (pause, resume, check requests)."""
    with env.locks.held("scheduler-state", timeout=10):
        state = SchedulerState.load(env.state_dir)
        for key, value in changes.items():
            setattr(state, key, value)
        state.save(env.state_dir)
    return state
