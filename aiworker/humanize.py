"""Words for people: times relative to now and to the second, and tables that fit.

Every human rendering (status, providers, task list and show, qemu list, doctor)
reads at 80 columns: a table's headers are never cut (each column is at least as wide
as its header) and long cells fold onto more lines instead of ending in an ellipsis.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

# Control characters but the line break and the tab: an issue's title, a provider's
# reason or an operator's pause reason can carry escape sequences that would recolour,
# retitle or rewrite the operator's terminal. Shown as \xNN instead.
# The bidirectional overrides and isolates too: they reorder what follows them on the
# line, so that a title could show as something it is not.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_LINE = re.compile(r"[\t\n\u2028\u2029]")  # line and paragraph separators too


def printable(text: str) -> str:
    """TEXT with every terminal control character shown as its \\xNN (\\uNNNN) escape."""
    return _CONTROL.sub(_escaped, text)


def one_line(text: str) -> str:
    """printable TEXT as one line: its line breaks and tabs escaped too (a table cell, an
    error message: a title with a line break would forge a row or a line of its own)."""
    return _LINE.sub(_escaped, printable(text))


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_UNITS = ((86400, "d"), (3600, "h"), (60, "min"), (1, "s"))


def moment(value: datetime | str | None) -> datetime | None:
    """VALUE as an aware datetime (ISO text is parsed; naive times are UTC)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def span(seconds: float) -> str:
    """A duration in its largest whole unit: "45 s", "4 min", "3 h", "2 d"."""
    seconds = abs(int(seconds))
    for size, unit in _UNITS:
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return "0 s"


def ago(value: datetime | str | None, now: datetime | None = None) -> str:
    """ "4 min ago", "in 2 min", "just now"; "never" when there is no time."""
    when = moment(value)
    if when is None:
        return "never"
    delta = ((now or datetime.now(UTC)) - when).total_seconds()
    if abs(delta) < 1:
        return "just now"
    return f"{span(delta)} ago" if delta > 0 else f"in {span(delta)}"


def exact(value: datetime | str | None, now: datetime | None = None) -> str:
    """To the second, in UTC: "12:22:41" today, "2026-11-30 12:22:41" otherwise."""
    when = moment(value)
    if when is None:
        return "-"
    when = when.astimezone(UTC)
    today = (now or datetime.now(UTC)).astimezone(UTC).date()
    return when.strftime("%H:%M:%S" if when.date() == today else "%Y-%m-%d %H:%M:%S")


def both(value: datetime | str | None, now: datetime | None = None) -> str:
    """ "4 min ago (12:22:41)"; "never" when there is no time."""
    return "never" if moment(value) is None else f"{ago(value, now)} ({exact(value, now)})"


def table(*headers: str, title: str | None = None) -> Any:
    """A rich table whose headers are never cut and whose cells fold when long."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    class Printable(Table):
        """Cells are text as it is: no control characters, and no rich markup either (a
        reason such as "[/bold]" would fail the rendering, "[red]" recolour it)."""

        def add_row(self, *cells: Any, **options: Any) -> None:
            shown = [Text(one_line(c)) if isinstance(c, str) else c for c in cells]
            super().add_row(*shown, **options)

    grid = Printable(
        title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False, show_edge=False
    )
    for header in headers:
        grid.add_column(header, min_width=len(header), overflow="fold")
    return grid


def fold(line: str, indent: str = "  ") -> str:
    """LINE wrapped at the terminal's width (80 when it is not a terminal), its later
    lines indented: long reasons are folded, never cut."""
    import shutil
    import textwrap

    width = shutil.get_terminal_size((80, 24)).columns
    return textwrap.fill(line, width=max(width, 40), subsequent_indent=indent)
