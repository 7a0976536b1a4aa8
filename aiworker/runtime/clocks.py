"""The wall clock against real time. The wall clock can be stepped (an NTP correction
after boot, a resumed VM, an operator's `date -s`); CLOCK_BOOTTIME counts the time since
boot, is shared by every process of this host and is never stepped. A moment marked by
both shows, at a later mark of the same boot, whether the wall clock stepped between."""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
STEP_S = 5.0  # a wall clock that moved this much more or less than real time stepped


class Mark(NamedTuple):
    boot: str  # this boot's id: real time counts from it
    wall: float  # time.time()
    real: float  # CLOCK_BOOTTIME


def mark() -> Mark:
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        boot = ""
    return Mark(boot, time.time(), time.clock_gettime(time.CLOCK_BOOTTIME))


def as_mark(value: object) -> Mark | None:
    """VALUE as a Mark (as JSON keeps one: a list), or None when it is not one."""
    if not isinstance(value, list | tuple) or len(value) != 3:
        return None
    boot, wall, real = value
    if isinstance(boot, str) and all(isinstance(v, int | float) for v in (wall, real)):
        return Mark(boot, float(wall), float(real))
    return None


def stepped(before: Mark | None, now: Mark) -> bool:
    """Whether the wall clock stepped between BEFORE and NOW (a mark of another boot, or
    none, cannot tell: False)."""
    if before is None or before.boot != now.boot or not now.boot:
        return False
    return abs((now.wall - before.wall) - (now.real - before.real)) > STEP_S
