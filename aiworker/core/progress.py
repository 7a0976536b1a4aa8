"""Progress of long work (building an image, a cache layer, a first fetch): the stages
it passes through as they begin, and, as passing detail, what it prints meanwhile.
The command decides how to show them (a spinner on a terminal, plain lines otherwise,
nothing under --json)."""

from __future__ import annotations

from typing import Protocol


class Stages(Protocol):
    def __call__(self, text: str, *, passing: bool = False) -> None: ...


def quiet(text: str, *, passing: bool = False) -> None:
    """Nobody watches: stages are not shown."""
