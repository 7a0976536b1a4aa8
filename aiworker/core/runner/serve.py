"""`runner serve` and `runner run-job` on top of the agent (`runner doctor`:
runner_doctor.py).

serve: one job at a time; waiting by long-poll (or polling every interval); an
unreachable controller means reconnecting with full-jitter backoff up to 30 s; a refused
token or an unknown contract ends it (exit 77), never a silent downgrade. The first
SIGTERM or SIGINT stops claiming and lets the running job finish within its own deadline;
a second ends the job now (delivered as failed, runner_stopped).
"""

from __future__ import annotations

import logging
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from aiworker.adapters.runner_api import ServerUnavailable
from aiworker.core.report import Report
from aiworker.core.runner.agent import (
    AgentOptions,
    JobOutcome,
    claim_body,
    jittered,
    new_key,
    run_leased,
    select_contract,
)
from aiworker.core.runner.controllers import Controller
from aiworker.errors import (
    EXIT_FAILED,
    EXIT_OK,
    AiworkerError,
    InvalidInput,
    LockHeld,
    disk_full,
)
from aiworker.runtime.attempts import ensure_private_root
from aiworker.runtime.locks import FileLock
from aiworker.runtime.processes import keep_memory_private

log = logging.getLogger(__name__)
FULL_WAIT_S, FULL_WAIT_CAP_S = 5.0, 300.0  # a full attempt root: the wait before a claim


@dataclass
class ServeReport(Report):
    worker_id: str
    contract: str
    jobs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if not self.jobs:
            return EXIT_OK
        last = self.jobs[-1]
        ok = (last["delivered"], last["status"]) == ("complete", "succeeded")
        return EXIT_OK if ok else EXIT_FAILED


class _Stop(Exception):
    pass


class Signals:
    """SIGTERM/SIGINT: the first sets STOP (and interrupts an idle wait), a second ABORT."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.abort = threading.Event()
        self.idle = False
        self.job: threading.Event | None = None  # the running job's cancel

    @classmethod
    def installed(cls) -> Signals:
        signals = cls()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signals._handle)
            signal.signal(signal.SIGINT, signals._handle)
        return signals

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        if self.stop.is_set():
            self.abort.set()
            if self.job is not None:
                self.job.set()
        self.stop.set()
        if self.idle:
            raise _Stop


def lock_attempt_root(root: Path) -> FileLock:
    """An exclusive lock on ROOT: one serving runner per attempt root."""
    try:
        ensure_private_root(root)
    except FileExistsError:
        raise InvalidInput(f"--attempt-root {root}: exists and is not a directory") from None
    except OSError as exc:  # not a directory, another user's, not creatable
        raise InvalidInput(f"--attempt-root {root}: {exc.strerror or exc}") from None
    lock = FileLock(root / ".runner.lock", description="a runner serving this attempt root")
    if not lock.try_acquire():
        raise LockHeld(f"another runner serves the attempt root {root} (pid {lock.holder_pid()})")
    return lock


def serve(
    controller: Controller, options: AgentOptions, *, once: bool, signals: Signals
) -> ServeReport:
    keep_memory_private()  # the jobs run as this user; the token must stay out of reach
    lock = lock_attempt_root(options.settings.attempt_root)
    try:
        contract = _connect(controller, once, signals)
        report = ServeReport(options.worker_id, contract)
        if not contract:
            log.info("runner %s: stopped before the controller answered", options.worker_id)
            return report
        log.info("runner %s: serving, contract %s", options.worker_id, contract)
        failures = full = 0
        key = new_key()
        while not signals.stop.is_set():
            asked = time.monotonic()
            try:
                claimed = _claim(controller, options, key, signals)
            except _Stop:
                _give_back(controller, options, key)
                break
            except ServerUnavailable as exc:
                if once:
                    raise
                failures = _back_off(signals, failures, exc)
                continue  # the same key: a claim whose answer was lost is answered again
            if failures:
                log.info("controller reachable again after %d failed tries", failures)
                failures = 0
            if claimed is None:
                waited = time.monotonic() - asked
                if options.long_poll_ms == 0 or waited < options.long_poll_ms / 2000:
                    signals.stop.wait(options.poll_interval_s)
                continue
            key = new_key()
            try:
                outcome = _run(controller, claimed, options, signals)
            except Exception as exc:
                full = _wait_for_room(exc, once, options, signals, full + 1)
                continue
            full = 0
            report.jobs.append(_job(outcome))
            if once:
                break
        return report
    finally:
        lock.release()


def _claim(
    controller: Controller, options: AgentOptions, key: str, signals: Signals
) -> dict[str, Any] | None:
    """A job, or None once the long-poll ended without one (a signal meanwhile: _Stop)."""
    signals.idle = True
    try:
        return controller.claim(claim_body(options, key, options.long_poll_ms))
    finally:
        signals.idle = False


def _run(
    controller: Controller, claimed: dict[str, Any], options: AgentOptions, signals: Signals
) -> JobOutcome:
    signals.job = threading.Event()
    if signals.abort.is_set():
        signals.job.set()
    try:
        return run_leased(controller, claimed, options, signals.job)
    finally:
        signals.job = None


def _give_back(controller: Controller, options: AgentOptions, key: str) -> None:
    """Stopped while a claim was waiting: if the controller leased a job to that claim,
    hand it back unstarted (asking again with the same key, for that lease only)."""
    try:
        claimed = controller.claim({**claim_body(options, key, 0), "repeat_only": True})
        if claimed is not None:
            pair = (int(claimed["repository_index"]), int(claimed["worker_job_index"]))
            controller.release(pair, str(claimed["lease_token"]))
            log.info("worker job %d/%d: handed back unstarted", *pair)
    except AiworkerError as exc:
        log.warning("a job leased as the runner stopped may wait for its lease: %s", exc)


def _connect(controller: Controller, once: bool, signals: Signals) -> str:
    """The contract, once the controller answers; "" when stopped before it did."""
    failures = 0
    while not signals.stop.is_set():
        try:
            contract = select_contract(controller)
            if failures:
                log.info("controller reachable after %d failed tries", failures)
            return contract
        except ServerUnavailable as exc:
            if once:
                raise
            failures = _back_off(signals, failures, exc)
    return ""


def _wait_for_room(
    exc: Exception, once: bool, options: AgentOptions, signals: Signals, full: int
) -> int:
    """The attempt root was too full for a job (handed back): wait before claiming again,
    from 5 s doubling to 5 minutes, so that a full host does not take every job queued.
    Any other failure of a job, or one of `--once`, is raised."""
    if once or not disk_full(exc):
        raise exc
    root = options.settings.attempt_root
    delay = min(FULL_WAIT_S * 2 ** (full - 1), FULL_WAIT_CAP_S)
    free = shutil.disk_usage(root).free // 1024**2
    log.warning("attempt root %s is full (%d MiB free); claiming again in %d s", root, free, delay)
    signals.stop.wait(delay)
    return full


def _back_off(signals: Signals, failures: int, exc: ServerUnavailable) -> int:
    """Wait (full jitter, up to 30 s; a stop ends the wait) after one more failure."""
    delay = jittered(failures + 1)
    log.warning("controller unreachable (%s); again in %.1f s", exc.message, delay)
    signals.stop.wait(delay)
    return failures + 1


def _job(outcome: JobOutcome) -> dict[str, Any]:
    log.info(
        "worker job %d/%d attempt %d: %s, %s",
        *outcome.pair,
        outcome.attempt,
        outcome.delivered,
        outcome.status,
    )
    return {
        "repository_index": outcome.pair[0],
        "worker_job_index": outcome.pair[1],
        "attempt": outcome.attempt,
        "delivered": outcome.delivered,
        "status": outcome.status,
        "worker_ms": outcome.worker_ms,
    }


def run_job(
    controller: Controller, options: AgentOptions, pair: tuple[int, int], signals: Signals
) -> ServeReport:
    """Claim exactly PAIR (never another job), run it and deliver it."""
    keep_memory_private()
    contract = select_contract(controller)
    body = claim_body(options, new_key(), 0)
    body.pop("repository_indexes", None)
    body["exact"] = {"repository_index": pair[0], "worker_job_index": pair[1]}
    claimed = controller.claim(body)
    if claimed is None:
        raise AiworkerError(
            f"worker job {pair[0]}/{pair[1]} is not claimable (unknown, finished, or leased)",
            code="not_claimable",
        )
    report = ServeReport(options.worker_id, contract)
    report.jobs.append(_job(_run(controller, claimed, options, signals)))
    return report
