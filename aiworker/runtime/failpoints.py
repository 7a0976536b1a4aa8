"""Crash points for the fault tests: AIWORKER_FAILPOINT=NAME kills the process right there
(SIGKILL, nothing runs after it); NAME:raise raises an ordinary exception instead;
NAME:term sends the process SIGTERM there (a stop request arriving at that moment);
NAME:hang makes it wait there for ever (a job stuck in a call that never returns).

Nothing happens unless that variable names the point; operators never set it. Every
point is listed in POINTS under the step whose job passes it, in the order it does: the
fault tests kill each job at each of its points, and a step without points (or a point not
listed) fails them.
"""

from __future__ import annotations

import os
import signal
import time

# Between the durable writes of each step (the phase commands, and the runner listener).
POINTS: dict[str, tuple[str, ...]] = {
    "plan": (
        "planning.attempt_started",
        "planning.after_run",
        "planning.after_decision",
        "planning.after_post",
    ),
    "implement": ("implementation.attempt_started", "implementation.after_run"),
    "repair": ("repair.attempt_started", "repair.after_run"),
    "publish": (
        "publish.attempt_started",
        "publish.before_request",
        "publish.after_request",
        "publish.after_record",
    ),
    "ci": ("ci.attempt_started", "ci.after_pending", "ci.after_checks"),
    "review": (
        "review.attempt_started",
        "review.after_run",
        "review.after_decision",
        "review.after_post",
    ),
    "merge": ("merge.attempt_started", "merge.after_request"),
    "milestones": (
        "milestones.after_accept",
        "milestones.attempt_started",
        "milestones.after_checks",
    ),
    "runner": ("runner_api.after_chunk", "runner_api.after_finish"),
    "guests": ("guest_transfer.after_chunk",),
    "maintenance": ("backup.copying",),
}


class FailpointError(RuntimeError):
    pass


def failpoint(name: str) -> None:
    wanted = os.environ.get("AIWORKER_FAILPOINT")
    if wanted == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if wanted == f"{name}:raise":
        raise FailpointError(f"failpoint {name}")
    if wanted == f"{name}:term":
        os.kill(os.getpid(), signal.SIGTERM)
    while wanted == f"{name}:hang":
        time.sleep(3600)
