"""A stand-in phase for scheduler tests: records when it ran, then sleeps PHASE_SECONDS, or
with PHASE_RELEASE waits until that file exists (the test says when it may end).

Usage: phase_recorder.py --task ID --slot N   (PHASE_LOG and the rest from the environment)
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    args = dict(zip(sys.argv[1::2], sys.argv[2::2], strict=False))
    log = os.environ["PHASE_LOG"]
    line = f"{args['--task']} {args['--slot']} {os.getpid()} {time.time():.6f}"
    with open(log, "a") as handle:
        handle.write(f"start {line}\n")
    release = os.environ.get("PHASE_RELEASE")
    deadline = time.monotonic() + 300
    while release and not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not release:
        time.sleep(float(os.environ.get("PHASE_SECONDS", "1")))
    with open(log, "a") as handle:
        handle.write(f"end {args['--task']} {args['--slot']} {os.getpid()} {time.time():.6f}\n")


if __name__ == "__main__":
    main()
