"""Where guest images and running guests live (cheap to import: the tick looks here)."""

from __future__ import annotations

from pathlib import Path

from aiworker.core.context import Environment


def guests_root(env: Environment) -> Path:
    configured = env.loaded.config.execution.guests_dir
    if configured is None:
        return env.state_dir / "guests"
    path = Path(configured).expanduser()
    return path if path.is_absolute() else env.loaded.path.parent / path
