"""Measurement thresholds: a check may be held to numbers, not only to its exit code.

A check reports a measurement by printing `aiworker-measurement NAME VALUE` on its
stdout (the last value of a name counts). A threshold names the measurement, a
bound (`<=` or `>=`) that is absolute or a multiple of the same measurement at the
base (`1.10x baseline`), and an obligation: a `passing` threshold that is missed
fails the check; an `advisory` one is only recorded, but its measurements must be
complete all the same. The host takes both measurements itself (the base's by
running the same check there), and the receipt records them with each outcome.

In an issue's `aiworker-checks` block a threshold is a line of its own:

    perf: ./ci/run bench
    perf measures startup_ms <= 1.10x baseline (passing)
    perf measures rss_mb <= 300 (advisory)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

NAME = r"[a-z0-9][a-z0-9._-]{0,63}"
NUMBER = r"-?[0-9]+(?:\.[0-9]+)?"
REPORTED = re.compile(rf"^aiworker-measurement ({NAME}) ({NUMBER})\s*$", re.MULTILINE)
LINE = re.compile(
    rf"^({NAME}) measures ({NAME}) (<=|>=) ({NUMBER})(x baseline)? \((passing|advisory)\)$"
)


@dataclass(frozen=True)
class Threshold:
    name: str
    op: str  # <= | >=
    value: float
    relative: bool  # VALUE times the measurement at the base
    obligation: str  # passing | advisory

    def text(self) -> str:
        bound = f"{self.value:g}x baseline" if self.relative else f"{self.value:g}"
        return f"{self.name} {self.op} {bound} ({self.obligation})"


def threshold_line(line: str) -> tuple[str, Threshold] | None:
    """(check id, threshold) when LINE declares one, else None."""
    found = LINE.match(line.strip())
    if found is None:
        return None
    check, name, op, value, relative, obligation = found.groups()
    return check, Threshold(name, op, float(value), bool(relative), obligation)


def reported(stdout: str) -> dict[str, float]:
    """The measurements a run printed."""
    return {name: float(value) for name, value in REPORTED.findall(stdout)}


def judge(
    thresholds: Sequence[Threshold], head: dict[str, float], baseline: dict[str, float] | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each threshold's outcome (met, missed or incomplete) with the values it compared,
    and why the check fails because of them (empty when it does not)."""
    outcomes, failures = [], []
    for threshold in thresholds:
        value = head.get(threshold.name)
        base = (baseline or {}).get(threshold.name) if threshold.relative else None
        record: dict[str, Any] = {
            "threshold": threshold.text(),
            "head": value,
            "baseline": base,
        }
        if value is None or (threshold.relative and base is None):
            where = "at the head" if value is None else "at the base"
            record["outcome"] = "incomplete"
            failures.append(f"measurement {threshold.name} was not reported {where}")
        else:
            bound = threshold.value * base if base is not None else threshold.value
            met = value <= bound if threshold.op == "<=" else value >= bound
            record["bound"], record["outcome"] = bound, "met" if met else "missed"
            if not met and threshold.obligation == "passing":
                failures.append(
                    f"threshold missed: {threshold.name} is {value:g}, "
                    f"not {threshold.op} {bound:g} ({threshold.text()})"
                )
        outcomes.append(record)
    return outcomes, failures
