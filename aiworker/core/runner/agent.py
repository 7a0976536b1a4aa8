"""The runner agent: claim a worker job from the controller, materialise its exact
snapshot, run ./ci/run in a fresh attempt while a separate thread keeps the lease, and
deliver the result once (retried on transport failures; lease_lost or "already finished"
is final). Used by `runner serve`, `runner run-job` and the embedded runner.

A lease that stops holding (the controller says so, or no heartbeat succeeded before it
expired) ends the job at once and nothing is delivered: the controller has already
given the job to another attempt or ended it.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiworker import logs
from aiworker.adapters.runner_api import LeaseGone, Rejected, ServerUnavailable
from aiworker.contracts.native_job import (
    REQUEST_CONTRACT,
    JobRequest,
    Materialization,
    RemoteSnapshotSource,
)
from aiworker.core.runner.controllers import Controller
from aiworker.core.runner.execute import DEFAULT_LOG_BYTES, RunnerSettings, run_attempt
from aiworker.core.runner.lease_keeper import LeaseKeeper
from aiworker.core.runner.materialise import GIB, Bounds, materialise
from aiworker.core.runner.requests import RequestRejected, parse_request, source_of
from aiworker.core.runner.uploads import keep_logs
from aiworker.errors import AiworkerError, InvalidInput, Refused, disk_full
from aiworker.runtime.attempts import default_attempt_root
from aiworker.secrets import redact

log = logging.getLogger(__name__)
BACKOFF_CAP_S = 30.0
DELIVERY_DEADLINE_S = 600.0


@dataclass(frozen=True)
class AgentOptions:
    worker_id: str
    settings: RunnerSettings
    repository_indexes: tuple[int, ...] | None = None
    poll_interval_s: float = 1.0
    heartbeat_interval_s: float = 30.0
    long_poll_ms: int = 25_000
    bounds: Bounds = field(default_factory=Bounds)
    delivery_deadline_s: float = DELIVERY_DEADLINE_S


@dataclass(frozen=True)
class JobOutcome:
    pair: tuple[int, int]
    attempt: int
    delivered: str  # complete | fail | lease_lost | undelivered
    status: str  # the result's status, or the error's code
    worker_ms: int  # the runner's own time: everything but ./ci/run


def agent_options(
    worker_id: str,
    roots: tuple[Path, Path | None],
    limits: tuple[int, int, int],
    **more: Any,
) -> AgentOptions:
    """Options from the command line: ROOTS (source, attempt; None for the default) and
    LIMITS (files, total GiB, GiB per pack); a worker id the controller would refuse is
    refused here."""
    if not re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", worker_id):
        raise InvalidInput(f"--worker-id {worker_id!r}: up to 128 of A-Z a-z 0-9 . _ : -")
    if not roots[0].is_dir():  # else every local job it took would fail, one by one
        raise InvalidInput(f"--source-root {roots[0]}: no such directory")
    settings = RunnerSettings(
        source_root=roots[0].absolute(),
        attempt_root=(roots[1] or default_attempt_root()).absolute(),
        log_bytes=DEFAULT_LOG_BYTES,
    )
    bounds = Bounds(files=limits[0], total_bytes=limits[1] * GIB, pack_bytes=limits[2] * GIB)
    return AgentOptions(worker_id=worker_id, settings=settings, bounds=bounds, **more)


def select_contract(controller: Controller) -> str:
    """The request contract this runner speaks, if the controller offers it; else Refused."""
    document, _offset = controller.health()
    offered = document.get("contracts") or []
    if REQUEST_CONTRACT not in offered:
        raise Refused(f"the controller offers {offered}; this runner speaks {REQUEST_CONTRACT}")
    return REQUEST_CONTRACT


def run_leased(
    controller: Controller,
    claimed: dict[str, Any],
    options: AgentOptions,
    cancel: threading.Event | None = None,
) -> JobOutcome:
    """Run the job of lease CLAIMED and deliver its outcome, heartbeating until it is
    delivered. CANCEL (this job's; the caller may set it to stop the job now, which is
    then delivered as failed, runner_stopped) is also set when the lease stops holding,
    and then nothing is delivered."""
    began = time.monotonic()
    pair = (int(claimed["repository_index"]), int(claimed["worker_job_index"]))
    named = logs.job_id.set(f"{pair[0]}/{pair[1]}")
    token = str(claimed["lease_token"])
    cancel = cancel or threading.Event()
    leases = (_lease_left(claimed), float(claimed.get("lease_seconds") or _lease_left(claimed)))
    keeper = LeaseKeeper(controller, pair, token, leases, options.heartbeat_interval_s, cancel)
    keeper.confirm()
    keeper.start()
    ran_ms = 0
    try:
        try:
            if keeper.lost.is_set():
                raise RequestRejected("lease_lost", "the controller refuses the lease")
            request = _check(parse_request(json.dumps(claimed["request"]).encode()), pair)
            # The logs get half the delivery's time: the result itself matters more.
            sending = (controller, pair, token, options.delivery_deadline_s / 2, cancel)
            result = run_attempt(
                request,
                options.settings,
                _filler(controller, _remote(request), options.bounds, cancel, token),
                cancel=cancel,
                keep=lambda logs: keep_logs(*sending, logs),
            )
            ran_ms = result["duration_ms"]
            if cancel.is_set() and not keeper.lost.is_set():
                raise RequestRejected("runner_stopped", "the runner was stopped during the job")
            kind, status = "complete", str(result["status"])
            body: dict[str, Any] = {"result": result}
        except (RequestRejected, AiworkerError, OSError) as exc:
            if disk_full(exc) and not keeper.lost.is_set():
                # This host's disk, not the job: another runner, with room, takes it.
                _hand_back(controller, pair, token)
                raise
            # Whatever kept the job from running is its outcome, with the reason.
            code = getattr(exc, "code", None) or "runner_error"
            message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            error = {"code": code, "message": redact(message)[:2000]}
            error["field"] = getattr(exc, "field", None)
            kind, status, body = "fail", code, {"error": error}
        if keeper.lost.is_set():
            log.warning("worker job %d/%d: the lease no longer holds; nothing delivered", *pair)
            return JobOutcome(pair, claimed["attempt"], "lease_lost", status, _ms(began) - ran_ms)
        keeper.delivering = True
        delivered = deliver(controller, pair, kind, token, body, options.delivery_deadline_s)
    finally:
        keeper.stop()
        logs.job_id.reset(named)  # the next job's lines name their own
    return JobOutcome(pair, claimed["attempt"], delivered, status, _ms(began) - ran_ms)


def _hand_back(controller: Controller, pair: tuple[int, int], token: str) -> None:
    try:
        controller.release(pair, token)
        log.warning("worker job %d/%d: handed back, this host's disk is full", *pair)
    except AiworkerError as exc:
        log.warning("worker job %d/%d could not be handed back: %s", *pair, exc.message)


def _lease_left(claimed: dict[str, Any]) -> float:
    """Seconds the lease has left, as the controller counted them (no clock skew); a
    claim repeated after a lost reply may hold an older lease with less left."""
    if "lease_remaining_ms" in claimed:
        return float(claimed["lease_remaining_ms"]) / 1000
    return _seconds_until(str(claimed["lease_expires_at"]))


def _check(request: JobRequest, pair: tuple[int, int]) -> JobRequest:
    source = _remote(request)
    if source["repository_index"] != pair[0]:
        raise RequestRejected(
            "repository_mismatch",
            f"the request is for repository {source['repository_index']}, the job for {pair[0]}",
            "source.repository_index",
        )
    return request


def _remote(request: JobRequest) -> RemoteSnapshotSource:
    why = "a fleet job must name a remote snapshot; a runner never runs a local tree"
    source: RemoteSnapshotSource = source_of(request, "remote_snapshot", "source_not_remote", why)
    return source


def deliver(
    controller: Controller,
    pair: tuple[int, int],
    kind: str,
    token: str,
    body: dict[str, Any],
    deadline_s: float,
) -> str:
    """Deliver once; retry transport failures from 1 s, doubling to 30 s, until DEADLINE_S.
    A result the controller refuses is delivered as a failure saying why."""
    give_up = time.monotonic() + deadline_s
    delay = 1.0
    while True:
        try:
            answer = controller.finish(pair, kind, token, body)
            log.info("worker job %d/%d: %s (%s)", *pair, kind, answer.get("status"))
            return kind
        except LeaseGone:
            return "lease_lost"
        except Rejected as exc:
            if exc.code == "artifact_incomplete" and body["result"].get("artifacts"):
                # A log the controller does not hold whole (removed meanwhile): the result
                # goes without its logs; it still carries the tails.
                log.warning("worker job %d/%d: %s; delivering without logs", *pair, exc.message)
                body = {"result": {**body["result"], "artifacts": []}}
                continue
            if kind != "complete":
                log.error("worker job %d/%d: failure refused: %s", *pair, exc.message)
                return "undelivered"
            error = {"code": "result_refused", "message": exc.message[:2000], "field": None}
            kind, body = "fail", {"error": error}
        except ServerUnavailable as exc:
            if time.monotonic() + delay > give_up:
                log.error("worker job %d/%d: not delivered: %s", *pair, exc.message)
                return "undelivered"
            time.sleep(delay)
            delay = min(delay * 2, BACKOFF_CAP_S)


def _filler(
    controller: Controller,
    source: RemoteSnapshotSource,
    bounds: Bounds,
    cancel: threading.Event,
    lease: str,
) -> Callable[[Path, Path], Materialization]:
    locked: dict[str, tuple[int, str]] = {}
    for path, ref in source["external"].items():
        index, _, snapshot = ref.partition(":")
        if not index.isdigit() or not snapshot:
            raise RequestRejected(
                "external_invalid",
                f"external {path!r} must be locked as INDEX:SNAPSHOT_ID",
                "source.external",
            )
        locked[path] = (int(index), snapshot)

    def fill(workspace: Path, scratch: Path) -> Materialization:
        # Every snapshot's packs go to the attempt's scratch folder, outside the workspace.
        externals: dict[str, Callable[[Path], Materialization]] = {}
        for number, (path, (index, snapshot)) in enumerate(sorted(locked.items())):

            def one(target: Path, i: int = index, s: str = snapshot, n: int = number) -> Any:
                return materialise(
                    controller.fetcher(i, s, lease, cancel), s, target, scratch / f"x{n}", bounds
                )

            externals[path] = one
        main = (source["repository_index"], source["snapshot_id"])
        fetcher = controller.fetcher(*main, lease, cancel)
        written = materialise(
            fetcher, source["snapshot_id"], workspace, scratch / "main", bounds, externals
        )
        if cancel.is_set():  # the lease went while the snapshot came: do not start it
            raise RequestRejected("runner_stopped", "the job was stopped before it started")
        return written

    return fill


def _seconds_until(moment: str) -> float:
    return max(0.0, (datetime.fromisoformat(moment) - datetime.now(UTC)).total_seconds())


def _ms(began: float) -> int:
    return int((time.monotonic() - began) * 1000)


def claim_body(options: AgentOptions, key: str, wait_ms: int) -> dict[str, Any]:
    body: dict[str, Any] = {"worker_id": options.worker_id, "request_key": key, "wait_ms": wait_ms}
    if options.repository_indexes is not None:
        body["repository_indexes"] = list(options.repository_indexes)
    return body


def new_key() -> str:
    return uuid.uuid4().hex


def jittered(attempt: int) -> float:
    """Full jitter: anywhere from 0 to 1 s doubled per failure, capped at 30 s."""
    return random.uniform(0, min(BACKOFF_CAP_S, 2.0**attempt))
