"""The Job: one run of one phase for one task, as the driver took it up, and the guard
around it. Whatever happens inside `with job:`, the attempt ends with an outcome and a
reason, its workspace is removed or kept with a recorded reason, and the task lands in
a defined state. A termination signal unwinds through it like any other failure
(runtime/interrupts.py); only SIGKILL skips it, and recovery closes what it left
(tasks/recovery.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiworker import logs
from aiworker.core.context import Environment
from aiworker.core.maintenance.storage import space_shortage
from aiworker.core.phases.table import Phase
from aiworker.core.report import Report
from aiworker.core.tasks.budgets import land_after_failure
from aiworker.core.tasks.hold import hold_task
from aiworker.errors import EXIT_UNAVAILABLE, Interrupted, disk_full, failure_reason
from aiworker.runtime.failpoints import failpoint
from aiworker.runtime.interrupts import ignore_signals, signals_raise
from aiworker.runtime.workspace import ExecutionBackend, Workspace
from aiworker.store.attempts import finish_attempt, set_workspace, start_attempt
from aiworker.store.controllers import Heartbeat
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task
from aiworker.store.tasks import Writer, append_event, stop_requested
from aiworker.store.worker_job_records import end_awaited_by

log = logging.getLogger(__name__)


@dataclass
class Job:
    env: Environment
    db: Database
    phase: Phase
    task: Task  # as loaded; task.version is the version this job set
    repo: Repository
    started: str  # the state it started from
    slot: int | None = None
    pr: int | None = None  # the task's open pull request, for a step that needs one
    token: str | None = None  # the claim token a slot phase set: SLOT-pidPID
    failure_hook: Callable[[str], None] | None = None  # the body's own, run before the landing
    backend: ExecutionBackend | None = None  # tears down the workspace it tracks
    report: Report | None = None  # the body's report, once it made one
    attempt: int | None = None
    workspace: Workspace | None = None
    keep_reason: str | None = None
    finished: bool = False  # finish() ran: the exit's fallback writes nothing more
    spent: bool = False  # a provider ran: inference was spent, so nothing is refunded
    # What the job holds until it ends: its lock (when this process took it), then, inside
    # `with job:`, its heartbeat and its signal handlers.
    held: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)

    @property
    def holds(self) -> str:
        """The state the task is in while the job runs: its phase's, or for a step the
        state it is in now (the plan step moves its plan on as it goes)."""
        return self.phase.holds or str(self.task.state)

    @property
    def retry(self) -> str:
        """Where a retryable failure lands: its phase's, or a step's state now."""
        return self.phase.retry or self.holds

    def land(self, reason: str, state: str | None = None) -> str | None:
        """After a failure: STATE (the phase's retry state) while the budget lasts, else
        failed; None: the task moved meanwhile and is left as it is."""
        task, state = self.task, state or self.retry
        return land_after_failure(
            self.env,
            self.db,
            task.id,
            self.holds,
            task.version,
            self.phase.name,
            reason,
            retry_state=state,
        )

    def now(self) -> Task | None:
        """The task as it is recorded now."""
        with self.db.read() as session:
            return session.get(Task, self.task.id)

    def start(
        self,
        provider: str | None = None,
        settings: dict[str, object] | None = None,
        model: str | None = None,
        effort: str | None = None,
        *,
        checkpoint: bool = True,
    ) -> int:
        """Record the attempt (charged to the phase's budget), where it runs and the
        settings it runs with; CHECKPOINT: then pass its failpoint (the failure path's own
        record of an attempt passes none)."""
        name, settings = self.phase.name, settings or {}
        with self.db.write() as session:
            self.attempt = start_attempt(
                session,
                self.task.id,
                name,
                provider,
                model,
                effort,
                dict(settings),
                pid=os.getpid(),
                host=self.db.host,
            )
            self._event(session, "attempt.started", provider or name, settings)
        logs.attempt_id.set(self.attempt)
        self._log("started (%s)", provider or "host")
        if checkpoint:
            failpoint(f"{name}.attempt_started")
        return self.attempt

    def track(self, workspace: Workspace) -> Workspace:
        self.workspace = workspace
        if self.attempt is not None:
            with self.db.write() as session:
                set_workspace(session, self.attempt, str(workspace.root))
        return workspace

    def keep(self, reason: str) -> None:
        """Keep the workspace at teardown (work to retain), saying why."""
        self.keep_reason = reason

    def finish(self, outcome: str, reason: str = "", *, refunded: bool = False) -> None:
        """End the attempt so, once; one that recovery or an operator's cancel closed
        meanwhile keeps their outcome, and no event says otherwise."""
        if self.attempt is None or self.finished:
            return
        with self.db.write() as session:
            closed = finish_attempt(
                session, self.attempt, outcome, reason=reason, refunded=refunded
            )
            if closed:
                data = {"outcome": outcome, "reason": reason, "refunded": refunded}
                self._event(session, "attempt.finished", None, data)
        self.finished = True
        if closed:
            self._log("%s%s", outcome, f": {reason}" if reason else "")
        if closed and outcome != "succeeded":  # (a success read every delivery it awaited)
            # A check it queued and stopped waiting for: nobody will read its delivery.
            ended = {"error": f"the attempt awaiting it ended as {outcome}"}
            self._settle(functools.partial(end_awaited_by, self.db, self.attempt, ended))

    def _event(
        self, session: Writer, kind: str, actor: str | None, data: Mapping[str, object]
    ) -> None:
        data = {"attempt": self.attempt, "phase": self.phase.name, **data}
        append_event(session, kind, task_id=self.task.id, actor=actor, data=data)

    def _log(self, what: str, *args: object) -> None:
        log.info(
            "task %d: %s attempt %d " + what, self.task.id, self.phase.name, self.attempt, *args
        )

    def __enter__(self) -> Job:
        self.held.enter_context(signals_raise())
        self.held.enter_context(Heartbeat(self.db))  # others see this host alive meanwhile
        return self

    def __exit__(self, _type: object, exc: BaseException | None, _tb: object) -> None:
        ignore_signals()  # a second signal must not cut the clean-up short
        try:
            if exc is not None:
                self._failed(exc)
            else:
                self.finish("error", "the phase ended without recording an outcome")
                self._teardown()
        finally:
            self.held.close()

    def _failed(self, exc: BaseException) -> None:
        reason = failure_reason(exc)
        log.warning("task %d: %s failed: %s", self.task.id, self.phase.name, reason)
        # Something outside was unavailable (the forge, a lock, the disk), or the
        # installation is at fault (a token the forge refuses), before any inference: not
        # this attempt's fault, so it is refunded; the task waits where it retries. A full
        # disk after inference is held for the operator: retried by itself, a run whose
        # own output fills the disk would spend inference again and again.
        full = disk_full(exc) or (
            disk_full(exc, words=True) and space_shortage(self.env) is not None
        )
        outside = getattr(exc, "exit_code", None) == EXIT_UNAVAILABLE or full
        installation = getattr(exc, "installation", False) and not self.spent
        held = installation or (full and self.spent) or getattr(exc, "holds_task", False)
        # An operator's stop is no failure of the work: given back, whatever it spent.
        stop = self._stop_requested() if isinstance(exc, Interrupted) else None
        transient = (outside and not self.spent) or held or stop is not None
        outcome = "interrupted" if isinstance(exc, Interrupted) else "error"
        outcome = "stopped" if stop else "unavailable" if transient else outcome
        reason = stop or reason
        if self.attempt is None:
            # Failed before its attempt was recorded (reading the issue, fetching): it is
            # recorded now, so that a failure that repeats spends the budget and ends.
            failed: dict[str, object] = {"failed_before_start": True}
            self._settle(lambda: self.start(None, failed, checkpoint=False))
        record = functools.partial(self.finish, outcome, reason, refunded=transient)
        # On a full disk what the attempt left goes first, so that its end can be recorded.
        for clean in (self._teardown, record) if full else (record, self._teardown):
            self._settle(clean)
        # The body's hook, then the landing: held for the operator where only they can
        # help (every later try would meet the same refusal).
        for step in (self.failure_hook, self._hold if held else self.land):
            if step is not None:
                self._settle(functools.partial(step, reason))

    def _stop_requested(self) -> str | None:
        """Why an operator asked this job to stop (stop-slot), if one did."""
        try:
            with self.db.read() as session:
                return stop_requested(session, self.task.id, os.getpid())
        except Exception:  # unreadable now: the stop is taken for any other signal
            log.exception("task %d: whether an operator stopped it is unknown", self.task.id)
            return None

    def _hold(self, reason: str) -> None:
        task = self.task
        why = f"{reason}; held until an operator fixes it and runs `aiworker task resume {task.id}`"
        hold_task(self.db, task.id, self.holds, task.version, why, self.phase.command)

    def _settle(self, step: Callable[[], object]) -> None:
        """Run one clean-up step; a failure of one must not skip the others."""
        try:
            step()
        except Exception:
            log.exception("task %d: clean-up after %s failed", self.task.id, self.phase.name)

    def _teardown(self) -> None:
        if self.workspace is None or self.backend is None:
            return
        workspace, self.workspace = self.workspace, None
        kept = self.keep_reason is not None
        self.backend.teardown(workspace, preserve=kept)
        reason = self.keep_reason or "the attempt ended"
        with self.db.write() as session:
            kind = "workspace.kept" if kept else "workspace.removed"
            self._event(session, kind, None, {"path": str(workspace.root), "reason": reason})
