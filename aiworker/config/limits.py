"""How much work may take and what is kept: attempt budgets, deadlines, the free-space
reserve and housekeeping."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from aiworker.config.strict import Strict

RUN_LIMIT_S = 2 * 60 * 60  # one provider run of a phase, unless configured


class Budgets(Strict):
    """How many tries each phase gets per task before the task ends as failed."""

    implementation: Annotated[int, Field(ge=1, le=50)] = 3
    # Repair episodes after review findings, a red CI or a moved base.
    repair: Annotated[int, Field(ge=1, le=50)] = 3
    planning: Annotated[int, Field(ge=1, le=50)] = 3
    review: Annotated[int, Field(ge=1, le=50)] = 3
    # Each delivery step (publish, ci, merge, a plan's combined checks) separately.
    delivery: Annotated[int, Field(ge=1, le=50)] = 5

    def limit(self, phase: str) -> int:
        value = getattr(self, phase, None)
        return int(value) if isinstance(value, int) else self.delivery


class Deadlines(Strict):
    """How long work may take, in seconds. TASK: from a task's start (its first attempt
    since a person last handed it over: created, answered, approved, resumed, retried)
    to the tick that ends it as failed; 0: no deadline. Each phase: the longest one
    provider run may take, and never past what is left of the task's deadline."""

    task: Annotated[int, Field(ge=0, le=90 * 86_400)] = 86_400
    planning: Annotated[int, Field(ge=1, le=7 * 86_400)] = RUN_LIMIT_S
    implementation: Annotated[int, Field(ge=1, le=7 * 86_400)] = RUN_LIMIT_S
    repair: Annotated[int, Field(ge=1, le=7 * 86_400)] = RUN_LIMIT_S
    review: Annotated[int, Field(ge=1, le=7 * 86_400)] = RUN_LIMIT_S
    # A job of this host still running this long past its task's deadline is stuck (its
    # provider run ended at the deadline): the tick stops it, and the deadline ends the task.
    stuck: Annotated[int, Field(ge=1, le=7 * 86_400)] = 1800

    def run_limit(self, phase: str) -> int:
        value = getattr(self, phase, None) if phase not in ("task", "stuck") else None
        return int(value) if isinstance(value, int) else RUN_LIMIT_S


class Storage(Strict):
    # Free space kept on the state directory's file system: below it no new phase or
    # delivery step starts (recovery and cleanup go on), and doctor warns. 0: no reserve.
    reserve_gib: Annotated[float, Field(ge=0, le=1_000_000)] = 1.0


class Housekeeping(Strict):
    # Workspaces and logs of failed and cancelled tasks are kept this long for diagnosis.
    retention_days: Annotated[int, Field(ge=0, le=3650)] = 7
    # Scheduler check events kept (the latest); older ones are removed by the tick.
    check_events: Annotated[int, Field(ge=10, le=1_000_000)] = 1000
    # Worker job events kept, per kind (claimed, finished, ...): the latest.
    worker_job_events: Annotated[int, Field(ge=100, le=10_000_000)] = 100_000
    # scheduler.log and each task's log are rotated past this size; this many rotated
    # files are kept beside each.
    log_max_mib: Annotated[int, Field(ge=1, le=10_240)] = 10
    log_keep: Annotated[int, Field(ge=0, le=100)] = 3


class Retention(Strict):
    # How long a reference to an artifact (a check's streams and receipt, an attempt's
    # prompt and result) keeps its payload: from when it was stored, and never before
    # its task has ended this long ago. Records and digests stay after the payload goes.
    artifact_days: Annotated[int, Field(ge=1, le=3650)] = 7
    # The retention pass runs at most this often (from the tick) and removes at most
    # this many payloads per run.
    interval_s: Annotated[int, Field(ge=60, le=7 * 86_400)] = 3600
    batch: Annotated[int, Field(ge=1, le=100_000)] = 500
