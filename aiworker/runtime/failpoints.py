"""Crash points for the crash tests: AIWORKER_FAILPOINT=NAME kills the process right there.

Nothing happens unless that variable names the point; operators never set it.
"""

from __future__ import annotations

import os
import signal


def failpoint(name: str) -> None:
    if os.environ.get("AIWORKER_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
