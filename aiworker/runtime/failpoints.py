"""Crash points for the fault tests: AIWORKER_FAILPOINT=NAME kills the process right there
(SIGKILL, nothing runs after it); NAME:raise raises an ordinary exception instead.

Nothing happens unless that variable names the point; operators never set it.
"""

from __future__ import annotations

import os
import signal


class FailpointError(RuntimeError):
    pass


def failpoint(name: str) -> None:
    wanted = os.environ.get("AIWORKER_FAILPOINT")
    if wanted == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if wanted == f"{name}:raise":
        raise FailpointError(f"failpoint {name}")
