"""The global options of one command line, shared by every subcommand."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

# The largest id a row can have (a signed 64-bit integer): a larger one names no task,
# and the driver could not even bind it.
ID_MAX = 2**63 - 1

if TYPE_CHECKING:
    from aiworker.config.loader import LoadedConfig
    from aiworker.core.context import Environment


def default_config_path() -> tuple[Path, bool]:
    """The configuration path and whether the operator named it explicitly."""
    if value := os.environ.get("AIWORKER_CONFIG"):
        return Path(value), True
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "aiworker" / "config.toml", False


def default_state_dir() -> Path:
    if value := os.environ.get("AIWORKER_STATE_DIR"):
        return Path(value)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "aiworker"


@dataclass
class Invocation:
    config_path: Path
    config_required: bool
    state_dir: Path
    json: bool = False
    verbose: int = 0
    _config: LoadedConfig | None = field(default=None, repr=False)

    def config(self) -> LoadedConfig:
        if self._config is None:
            from aiworker.config.loader import load_config

            self._config = load_config(self.config_path, required=self.config_required)
        return self._config

    def usable_state_dir(self) -> Path:
        """The state directory, absolute; refused here when it is something else than a
        directory (every command would otherwise fail its own way on it)."""
        state_dir = self.state_dir.absolute()
        if state_dir.exists() and not state_dir.is_dir():
            from aiworker.errors import StateUnusable

            raise StateUnusable(f"state directory {state_dir} exists and is not a directory")
        return state_dir

    def environment(self) -> Environment:
        from aiworker.core.context import Environment

        return Environment(state_dir=self.usable_state_dir(), loaded=self.config())
