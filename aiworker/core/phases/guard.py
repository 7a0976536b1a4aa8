"""The guard around every unit of work: whatever happens, the attempt ends with an outcome
and a reason, its workspace is removed or kept with a recorded reason, and the task
lands in a defined state. A termination signal unwinds through it like any other
failure (runtime/interrupts.py); only SIGKILL skips it, and recovery closes what it left
(tasks/recovery.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from aiworker import logs
from aiworker.errors import EXIT_UNAVAILABLE, failure_reason
from aiworker.runtime.interrupts import Interrupted, ignore_signals, signals_raise
from aiworker.runtime.locks import FileLock
from aiworker.runtime.workspace import ExecutionBackend, Workspace
from aiworker.store.attempts import finish_attempt, set_workspace, start_attempt
from aiworker.store.controllers import Heartbeat
from aiworker.store.engine import Database
from aiworker.store.tasks import append_event

log = logging.getLogger(__name__)
Recover = Callable[[str], None]  # called with the reason when the block failed; lands the task


class PhaseGuard:
    """Owns one task's attempt of one phase for the length of a `with` block; BACKEND
    tears down the workspace it tracks, and LOCK (the job's, when this process took it)
    is released at the end."""

    def __init__(self, db: Database, task_id: int, phase: str, recover: Recover) -> None:
        self.db, self.task_id, self.phase, self.recover = db, task_id, phase, recover
        logs.task_id.set(task_id)  # every log line of this job names its task
        self.backend: ExecutionBackend | None = None
        self.lock: FileLock | None = None
        self.attempt: int | None = None
        self.workspace: Workspace | None = None
        self.keep_reason: str | None = None
        self.finished = False
        self.spent = False  # a provider ran: inference was spent, so nothing is refunded
        self._held = contextlib.ExitStack()

    def start(
        self,
        provider: str | None,
        settings: dict[str, object],
        model: str | None = None,
        effort: str | None = None,
    ) -> int:
        """Record the attempt (charged to the task's budget) and its process."""
        with self.db.write() as session:
            self.attempt = start_attempt(
                session,
                self.task_id,
                self.phase,
                provider,
                model,
                effort,
                dict(settings),
                pid=os.getpid(),
                host=self.db.host,
            )
            self._event(session, "attempt.started", provider or self.phase, **settings)
        logs.attempt_id.set(self.attempt)
        self._log("started (%s)", provider or "host")
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
        if self.attempt is None or self.finished:
            return
        with self.db.write() as session:
            finish_attempt(session, self.attempt, outcome, reason=reason, refunded=refunded)
            data = {"outcome": outcome, "reason": reason, "refunded": refunded}
            self._event(session, "attempt.finished", None, **data)
        self.finished = True
        self._log("%s%s", outcome, f": {reason}" if reason else "")

    def _log(self, what: str, *args: object) -> None:
        log.info("task %d: %s attempt %d " + what, self.task_id, self.phase, self.attempt, *args)

    def _event(self, session: Any, kind: str, actor: str | None, **data: object) -> None:
        data = {"attempt": self.attempt, "phase": self.phase, **data}
        append_event(session, kind, task_id=self.task_id, actor=actor, data=data)

    def __enter__(self) -> PhaseGuard:
        self._held.enter_context(signals_raise())
        self._held.enter_context(Heartbeat(self.db))  # others see this host alive meanwhile
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
            self._held.close()
            if self.lock is not None:
                self.lock.release()

    def _failed(self, exc: BaseException) -> None:
        reason = failure_reason(exc)
        log.warning("task %d: %s failed: %s", self.task_id, self.phase, reason)
        # Something outside was unavailable (the forge, a lock) before any inference: not
        # this attempt's fault, so it is refunded and retried within the budget.
        transient = getattr(exc, "exit_code", None) == EXIT_UNAVAILABLE and not self.spent
        outcome = "interrupted" if isinstance(exc, Interrupted) else "error"
        if self.attempt is None:
            # Failed before its attempt was recorded (reading the issue, fetching): it is
            # recorded now, so that a failure that repeats spends the budget and ends.
            self._settle(lambda: self.start(None, {"failed_before_start": True}))
        outcome = "unavailable" if transient else outcome
        self._settle(lambda: self.finish(outcome, reason, refunded=transient))
        self._settle(self._teardown)
        self._settle(lambda: self.recover(reason))

    def _settle(self, step: Callable[[], object]) -> None:
        """Run one clean-up step; a failure of one must not skip the others."""
        try:
            step()
        except Exception:
            log.exception("task %d: clean-up after %s failed", self.task_id, self.phase)

    def _teardown(self) -> None:
        if self.workspace is None or self.backend is None:
            return
        workspace, self.workspace = self.workspace, None
        kept = self.keep_reason is not None
        self.backend.teardown(workspace, preserve=kept)
        reason = self.keep_reason or "the attempt ended"
        with self.db.write() as session:
            kind = "workspace.kept" if kept else "workspace.removed"
            self._event(session, kind, None, path=str(workspace.root), reason=reason)
