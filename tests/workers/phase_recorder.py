"""A stand-in phase for scheduler tests: records when it ran, then sleeps.

Usage: phase_recorder.py --task ID --slot N   (PHASE_LOG, PHASE_SECONDS from the environment)
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
    time.sleep(float(os.environ.get("PHASE_SECONDS", "1")))
    with open(log, "a") as handle:
        handle.write(f"end {args['--task']} {args['--slot']} {os.getpid()} {time.time():.6f}\n")


if __name__ == "__main__":
    main()
