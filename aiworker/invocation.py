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
    if value := _named("AIWORKER_CONFIG"):
        return Path(value), True
    return _xdg("XDG_CONFIG_HOME", Path.home() / ".config") / "aiworker" / "config.toml", False


def default_state_dir() -> Path:
    if value := _named("AIWORKER_STATE_DIR"):
        return Path(value)
    return _xdg("XDG_STATE_HOME", Path.home() / ".local" / "state") / "aiworker"


def _named(variable: str) -> str:
    """VARIABLE's path; one of blanks is refused (Path(" ") would be a folder named so in
    the working directory), as --config and --state-dir refuse it."""
    value = os.environ.get(variable, "")
    if value and not value.strip():
        from aiworker.errors import InvalidInput

        raise InvalidInput(f"{variable} is blank: unset it, or name a path")
    return value


def _xdg(variable: str, fallback: Path) -> Path:
    """An XDG base directory: a relative one is ignored, as the specification says."""
    value = os.environ.get(variable, "")
    return Path(value) if os.path.isabs(value) else fallback


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
