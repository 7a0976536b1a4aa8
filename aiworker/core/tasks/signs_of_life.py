"""How long this host has itself watched each other controller's sign of life unchanged,
in real time, which no step of the wall clock bends (runtime/clocks.py).

Signs of life are stamped by the wall clock, and a controller silent for longer than its
lease is gone. Judged by the wall clock alone, a clock set forward (an NTP correction
after boot, a resumed VM, a mistaken `date -s`) makes every live controller look
silent, and its running jobs would be recovered and run a second time; a clock set back
keeps a dead one's work waiting for as long as the step. So every look at the signs of
life records, in this host's state directory, when it first saw each one as it is. A
sign of life watched unchanged is judged by real time alone. One seen for the first time
is judged by the wall clock, unless that clock stepped since this host's last look or
last tick: then it is only watched from now on, and given up once it stayed unchanged
for a lease of real time.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from aiworker.core.scheduler_state import SchedulerState
from aiworker.runtime.atomic import write_private_file
from aiworker.runtime.clocks import as_mark, mark, stepped
from aiworker.store.controllers import Sighting

FILE = "signs-of-life.json"


def watched(state_dir: Path, seen: dict[str, Sighting]) -> dict[str, Sighting]:
    """SEEN, each sighting with the seconds this host has watched it unchanged
    (watched_s; None: first seen now, and the wall clock may judge it); recorded for the
    next look."""
    now = mark()
    try:
        before = json.loads((state_dir / FILE).read_text())
        last_look = as_mark(before["mark"])
        firsts: dict[str, object] = dict(before["hosts"]) if last_look else {}
    except (OSError, ValueError, KeyError, TypeError):
        last_look, firsts = None, {}
    last_tick = as_mark(SchedulerState.load(state_dir).checked_mark)
    jumped = stepped(last_look, now) or stepped(last_tick, now)
    same_boot = last_look is not None and last_look.boot == now.boot != ""
    hosts, result = {}, {}
    for host, sighting in seen.items():
        stamp, first = sighting.at.isoformat(), firsts.get(host)
        same = isinstance(first, list) and len(first) == 2 and first[0] == stamp
        since = first[1] if same and isinstance(first, list) else None
        if same_boot and isinstance(since, int | float):
            hosts[host] = [stamp, since]
            result[host] = sighting._replace(watched_s=now.real - since)
        else:
            hosts[host] = [stamp, now.real]
            result[host] = sighting._replace(watched_s=0.0 if jumped else None)
    # Not recorded (a full disk): the next look finds the last record, or none.
    with contextlib.suppress(OSError):
        document = {"mark": list(now), "hosts": hosts}
        write_private_file(state_dir / FILE, json.dumps(document).encode())
    return result
