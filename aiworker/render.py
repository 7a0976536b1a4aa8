"""Output: one JSON document with --json, else a human rendering with rich."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from aiworker.secrets import redact


def emit(json_mode: bool, data: Any, human: Callable[[Any], None] | None = None) -> None:
    """Write DATA to stdout: JSON with --json, else HUMAN(console) or the JSON pretty-printed."""
    if json_mode or human is None:
        import json

        text = json.dumps(data, indent=None if json_mode else 2, default=str, sort_keys=False)
        sys.stdout.write(redact(text) + "\n")
        sys.stdout.flush()
        return
    human(console())


class PlainConsole:
    """Prints text lines without importing rich; anything richer (a table) goes through rich."""

    def print(self, *objects: Any, markup: bool = True, **options: Any) -> None:
        if all(isinstance(o, str) for o in objects) and not markup:
            sys.stdout.write(" ".join(objects) + "\n")
            return
        from rich.console import Console

        Console(highlight=False, soft_wrap=True).print(*objects, markup=markup, **options)


_STYLE = {"ok": "green", "warn": "yellow", "fail": "red"}


def emit_health(json_mode: bool, document: dict[str, Any]) -> None:
    """A health report (`doctor`, `runner doctor`): one check a line, its status coloured
    and its detail folded under itself at the terminal's width."""

    def human(out: Any) -> None:
        from rich.markup import escape

        from aiworker.humanize import fold

        for check in document["checks"]:
            style = _STYLE[check["status"]]
            line = fold(f"{check['status']:>4}  {check['name']:<14} {check['detail']}", " " * 21)
            out.print(f"[{style}]{line[:4]}[/{style}]{escape(line[4:])}")

    emit(json_mode, document, human)


def console() -> Any:
    return PlainConsole()


def emit_error(json_mode: bool, code: str, message: str, details: list[str] | None = None) -> None:
    message = redact(message)
    if json_mode:
        import json

        error: dict[str, Any] = {"code": code, "message": message}
        if details:
            error["details"] = [redact(d) for d in details]
        sys.stdout.write(json.dumps({"error": error}) + "\n")
        sys.stdout.flush()
    else:
        sys.stderr.write(f"aiworker: error: {message}\n")
        for detail in details or []:
            sys.stderr.write(f"  - {redact(detail)}\n")
        sys.stderr.flush()
