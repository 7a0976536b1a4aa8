"""Output: one JSON document with --json, else a human rendering with rich."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

# Imported here, not where used: an error is said even when no file can be opened any
# more (a host out of descriptors cannot read a module's source).
from aiworker.humanize import fold, one_line, printable
from aiworker.secrets import redact


def emit(json_mode: bool, data: Any, human: Callable[[Any], None] | None = None) -> None:
    """Write DATA to stdout: JSON with --json, else HUMAN(console) or the JSON pretty-printed."""
    if json_mode or human is None:
        text = json.dumps(data, indent=None if json_mode else 2, default=str, sort_keys=False)
        sys.stdout.write(redact(text) + "\n")
        sys.stdout.flush()
        return
    human(console())


class PlainConsole:
    """Prints text lines without importing rich; anything richer (a table) goes through rich."""

    def print(self, *objects: Any, markup: bool = True, **options: Any) -> None:

        objects = tuple(printable(o) if isinstance(o, str) else o for o in objects)
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

        for check in document["checks"]:
            style = _STYLE[check["status"]]
            line = fold(f"{check['status']:>4}  {check['name']:<14} {check['detail']}", " " * 21)
            out.print(f"[{style}]{line[:4]}[/{style}]{escape(line[4:])}")

    emit(json_mode, document, human)


def console() -> Any:
    return PlainConsole()


@contextlib.contextmanager
def stages_shown(json_mode: bool) -> Iterator[Any]:
    """A Stages callback for long work: nothing under --json; on a terminal, each stage
    printed with the time it began and a spinner showing the latest detail; otherwise
    one plain line a stage on stderr. All of it on stderr: stdout stays the report."""
    if json_mode:
        from aiworker.core.progress import quiet

        yield quiet
        return
    started = time.monotonic()

    def elapsed() -> str:
        return f"[{int(time.monotonic() - started):>4} s]"

    if not sys.stderr.isatty():

        def plain(text: str, *, passing: bool = False) -> None:
            if not passing:
                sys.stderr.write(f"{elapsed()} {printable(text)}\n")
                sys.stderr.flush()

        yield plain
        return
    from rich.console import Console
    from rich.markup import escape

    err = Console(stderr=True, highlight=False)
    with err.status("starting") as spinner:

        def live(text: str, *, passing: bool = False) -> None:
            text = printable(text)  # a guest's console output, shown as it is
            if passing:
                spinner.update(escape(text[: max(err.width - 4, 20)]))
                return
            err.print(f"{elapsed()} {escape(text)}")
            spinner.update(escape(text[: max(err.width - 4, 20)]))

        yield live


def emit_error(json_mode: bool, code: str, message: str, details: list[str] | None = None) -> None:
    message = redact(message) if json_mode else one_line(redact(message))
    if json_mode:
        error: dict[str, Any] = {"code": code, "message": message}
        if details:
            error["details"] = [redact(d) for d in details]
        sys.stdout.write(json.dumps({"error": error}) + "\n")
        sys.stdout.flush()
    else:
        sys.stderr.write(f"aiworker: error: {message}\n")
        for detail in details or []:
            sys.stderr.write(f"  - {one_line(redact(detail))}\n")
        sys.stderr.flush()
