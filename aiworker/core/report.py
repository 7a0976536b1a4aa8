"""The typed result every core operation returns: its fields are the command's `--json`
document and its exit_code is how the command exits, so no command chooses an exit
code by comparing strings."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from aiworker.errors import EXIT_OK


@dataclass
class Report:
    def to_json(self) -> dict[str, Any]:
        return {
            f.name: _plain(getattr(self, f.name))
            for f in fields(self)
            if not f.metadata.get("internal")  # the report's own, not the document's
        }

    @property
    def exit_code(self) -> int:
        return EXIT_OK

    def landed(self, state: str, refusal: str | None) -> None:
        """Hear where a phase's move left the task (REFUSAL: why the move was refused);
        a report with a `state` field says it."""
        if hasattr(self, "state"):
            self.state = state


def _plain(value: Any) -> Any:
    if isinstance(value, Report):
        return value.to_json()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
