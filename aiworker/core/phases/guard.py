"""The guard around every unit of work: whatever happens, the attempt ends with an outcome
and a reason, its private home is removed, its workspace is removed or kept with a
recorded reason, and the task lands in a defined state.

A SIGTERM (an operator's cancel, systemd stopping a unit) becomes an exception
inside the guarded block, so it takes the same path as any other failure; only
SIGKILL skips the guard, and recovery closes what it left (tasks/recovery.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType

from aiworker import logs
from aiworker.errors import EXIT_UNAVAILABLE, AiworkerError
from aiworker.runtime.locks import FileLock
from aiworker.runtime.workspace import ExecutionBackend, Workspace
from aiworker.store.attempts import finish_attempt, set_workspace, start_attempt
from aiworker.store.controllers import Heartbeat
from aiworker.store.engine import Database
from aiworker.store.tasks import append_event

log = logging.getLogger(__name__)
# Called with the reason when the guarded block failed; lands the task.
Recover = Callable[[str], None]


class PhaseInterrupted(BaseException):
    """A termination signal arrived while a phase ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into PhaseInterrupted in the main thread, for the block."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise PhaseInterrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def failure_reason(exc: BaseException) -> str:
    if isinstance(exc, AiworkerError):
        return exc.message
    if isinstance(exc, PhaseInterrupted):
        return str(exc)
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"unexpected {type(exc).__name__}: {first}"[:500]


class PhaseGuard:
    """Owns one task's attempt of one phase for the length of a `with` block."""

    def __init__(
        self,
        db: Database,
        task_id: int,
        phase: str,
        recover: Recover,
        backend: ExecutionBackend | None = None,
        lock: FileLock | None = None,
    ) -> None:
        self.db = db
        self.task_id = task_id
        logs.task_id.set(task_id)  # every log line of this job names its task
        self.phase = phase
        self.recover = recover
        self.backend = backend
        self.lock = lock  # the job's lock, when this process took it (released at the end)
        self.attempt: int | None = None
        self.workspace: Workspace | None = None
        self.keep_reason: str | None = None
        self.finished = False
        self.spent = False  # a provider ran: inference was spent, so nothing is refunded
        self._signals = signals_raise()
        self._heartbeat = Heartbeat(db)

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
            append_event(
                session,
                "attempt.started",
                task_id=self.task_id,
                actor=provider or self.phase,
                data={"attempt": self.attempt, "phase": self.phase, **settings},
            )
        logs.attempt_id.set(self.attempt)
        log.info(
            "task %d: %s attempt %d started (%s)",
            self.task_id,
            self.phase,
            self.attempt,
            provider or "host",
        )
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
            append_event(
                session,
                "attempt.finished",
                task_id=self.task_id,
                data={
                    "attempt": self.attempt,
                    "phase": self.phase,
                    "outcome": outcome,
                    "reason": reason,
                    "refunded": refunded,
                },
            )
        self.finished = True
        log.info(
            "task %d: %s attempt %d %s%s",
            self.task_id,
            self.phase,
            self.attempt,
            outcome,
            f": {reason}" if reason else "",
        )

    def __enter__(self) -> PhaseGuard:
        self._signals.__enter__()
        self._heartbeat.__enter__()  # other controllers see this host alive while it runs
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A second signal must not cut the clean-up short: it is ignored until the end.
        ignored = {
            sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGHUP)
        }
        try:
            if exc is not None:
                self._failed(exc)
            else:
                self.finish("error", "the phase ended without recording an outcome")
                self._teardown()
        finally:
            self._heartbeat.__exit__()
            for sig in ignored:
                signal.signal(sig, signal.SIG_DFL)
            self._signals.__exit__(None, None, None)
            if self.lock is not None:
                self.lock.release()

    def _failed(self, exc: BaseException) -> None:
        reason = failure_reason(exc)
        log.warning("task %d: %s failed: %s", self.task_id, self.phase, reason)
        outcome = "interrupted" if isinstance(exc, PhaseInterrupted) else "error"
        # Something outside was unavailable (the forge, a lock) before any inference: not
        # this attempt's fault, so it is refunded and retried within the budget.
        transient = getattr(exc, "exit_code", None) == EXIT_UNAVAILABLE and not self.spent
        outcome = "unavailable" if transient else outcome
        if self.attempt is None:
            # Failed before its attempt was recorded (reading the issue, fetching): it is
            # recorded now, so that a failure that repeats spends the budget and ends.
            self._settle(lambda: self.start(None, {"failed_before_start": True}))
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
        with self.db.write() as session:
            append_event(
                session,
                "workspace.kept" if kept else "workspace.removed",
                task_id=self.task_id,
                data={
                    "attempt": self.attempt,
                    "path": str(workspace.root),
                    "reason": self.keep_reason or "the attempt ended",
                },
            )
