"""A racing claimer: one process of the multi-process claim tests and benchmark.

Usage: claim_worker.py DB_URL GO_LOCK SLOT MODE

MODE "optimistic" reads the candidate outside the write transaction and lets
compare-and-update arbitrate; "next" selects inside the write transaction, as
the scheduler's claim does.
Prints "ready" once connected and imported, then waits until the parent
releases GO_LOCK (parents open it only when every worker is ready: on two cores,
eight processes still importing would steal the CPU from the race). Then claims
ready tasks until none are left and prints one JSON line with the ids it won,
how many compare-and-updates it lost, and when it finished (CLOCK_MONOTONIC).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time

from aiworker.store.claims import claim_next
from aiworker.store.engine import Database
from aiworker.store.task_records import ready_tasks
from aiworker.store.tasks import claim


def main() -> None:
    url, go_lock, slot, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    db = Database(url)
    holder = f"pid-{os.getpid()}"
    with db.read() as session:  # open the connection before the start signal
        ready_tasks(session, limit=1)
    print("ready", flush=True)
    fd = os.open(go_lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    started = time.perf_counter()
    won: list[int] = []
    lost = 0
    while mode == "next":
        task_id = claim_next(db, slot, holder)
        if task_id is None:
            break
        won.append(task_id)
    while mode == "optimistic":
        with db.read() as session:
            candidates = ready_tasks(session, limit=1)
        if not candidates:
            break
        with db.write() as session:
            if claim(session, candidates[0].id, candidates[0].version, slot, holder):
                won.append(candidates[0].id)
            else:
                lost += 1
    elapsed = time.perf_counter() - started
    # CLOCK_MONOTONIC is system-wide: the parent compares it with when it opened the gate.
    finished = time.monotonic()
    report = {"slot": slot, "won": won, "lost": lost, "seconds": elapsed, "finished": finished}
    print(json.dumps(report))
    db.dispose()


if __name__ == "__main__":
    main()
