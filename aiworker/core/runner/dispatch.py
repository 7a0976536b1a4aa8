"""Checks and CI as worker jobs (the controller's side): the exact tree of the commit is
published as a snapshot, a job naming it is queued, and its delivery is read back. With
`runners.mode = "embedded"` (the default) the controller's own embedded runner claims
exactly that job and runs it in this process; with "fleet" a `runner serve` somewhere
does, and a job nobody finishes in time is ended as failed, with the reason."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from aiworker.config.models import Runners
from aiworker.contracts.runner import REQUEST_CONTRACT, Delivery
from aiworker.contracts.snapshot import TREE_REFUSALS, Uncheckable
from aiworker.core.context import Environment
from aiworker.core.runner.agent import AgentOptions, new_key, run_leased
from aiworker.core.runner.execute import DEFAULT_LOG_BYTES, RunnerSettings
from aiworker.core.runner.local_controller import LocalController
from aiworker.core.runner.requests import RequestRejected
from aiworker.core.runner.snapshots import publish, published, remove_snapshot
from aiworker.errors import (
    SHORT_ADVICE,
    SHORT_WORDS,
    AiworkerError,
    ShortOfResources,
    Unavailable,
    disk_full,
    failure_reason,
)
from aiworker.runtime.attempts import default_attempt_root
from aiworker.runtime.gitcache import GitCache
from aiworker.runtime.locks import LockDir
from aiworker.runtime.processes import keep_memory_private, runs_with_arguments
from aiworker.store.engine import Database
from aiworker.store.worker_job_records import abandon, end_orphans, get_job, open_requests
from aiworker.store.worker_jobs import TERMINAL, enqueue

WAIT_STEP_S = 0.1
ORPHANED = "its controller process died before the embedded runner finished it"
log = logging.getLogger(__name__)


class WorkerJobFailed(AiworkerError):
    code = "worker_job_failed"


@dataclass(frozen=True)
class Dispatch:
    db: Database
    cache: GitCache
    state_dir: Path
    runners: Runners
    names: dict[int, str]
    # Where the embedded runner runs checks: a guest (GuestChecks) or bubblewrap on this
    # host (SandboxedChecks); None: plainly on this host.
    place: Any = None
    # How long the evidence of what ran is kept (retention.artifact_days).
    artifact_days: int = 7
    attempt: int | None = None  # the attempt that awaits the jobs: its recovery ends them

    @classmethod
    def of(cls, env: Environment, db: Database, attempt: int | None = None) -> Dispatch:
        from aiworker.core.guests.backends import checks_place

        config = env.loaded.config
        names = {r.index: f"{r.owner}/{r.name}" for r in config.repositories}
        return cls(
            db,
            GitCache(env.state_dir),
            env.state_dir,
            config.runners,
            names,
            checks_place(env),
            config.retention.artifact_days,
            attempt,
        )

    def run(
        self, index: int, commit: str, argv: Sequence[str], label: str, timeout_ms: int, suite: str
    ) -> Delivery:
        """Run ARGV (./ci/run ...) on COMMIT of repository INDEX as a worker job; its
        delivery, which holds a result (a job the runner could not run raises)."""
        locks = LockDir(self.state_dir)
        if self.runners.mode == "embedded":
            # Jobs whose embedded runner died with its controller: nobody else takes them.
            cutoff = timedelta(seconds=self.runners.lease_seconds)
            ended = end_orphans(self.db, cutoff, {"error": ORPHANED}, _holder_runs)
            if ended:
                log.warning("ended %d worker jobs whose controller process died", ended)
        with locks.held("snapshots", timeout=300):
            snapshot = publish(self.state_dir, self.cache.path(index), index, commit)
            request = {
                "contract": REQUEST_CONTRACT,
                "label": label,
                "source": {
                    "kind": "remote_snapshot",
                    "repository_index": index,
                    "repository_name": self.names.get(index, str(index)),
                    "snapshot_id": snapshot,
                },
                "command": {"argv": list(argv)},
                "timeout_ms": timeout_ms,
                "suite_id": suite,
            }
            pair = (index, enqueue(self.db, index, request, self.attempt))
        try:
            if self.runners.mode == "embedded":
                self._run_here(pair)
            else:
                try:
                    self._wait(pair, timeout_ms)
                except BaseException as exc:  # a stop of this process too
                    self._give_up(pair, exc)
                    raise
            return self.delivered(pair)
        finally:
            with locks.held("snapshots", timeout=300):
                still = {r["source"].get("snapshot_id") for r in open_requests(self.db, index)}
                for unused in published(self.state_dir, index) - still:
                    remove_snapshot(self.state_dir, index, unused)

    def _run_here(self, pair: tuple[int, int]) -> None:
        # The check runs as this user: keep this process's memory and environment (forge
        # tokens among them) out of its reach.
        keep_memory_private()
        controller = LocalController(self.db, self.state_dir, self.runners, self.artifact_days)
        options = AgentOptions(
            worker_id=f"embedded-{os.getpid()}",
            settings=RunnerSettings(
                source_root=self.state_dir,
                attempt_root=default_attempt_root(),
                place=self.place,
                log_bytes=DEFAULT_LOG_BYTES,
            ),
            heartbeat_interval_s=self.runners.lease_seconds / 3,
        )
        exact = {"repository_index": pair[0], "worker_job_index": pair[1]}
        claimed = controller.claim(
            {"worker_id": options.worker_id, "request_key": new_key(), "exact": exact}
        )
        if claimed is None:
            raise WorkerJobFailed(f"worker job {pair[0]}/{pair[1]} could not be claimed here")
        outcome, why = None, "was interrupted"
        try:
            outcome = run_leased(controller, claimed, options)
        except Exception as exc:
            if disk_full(exc):
                why = "found this host's disk full"
            raise
        finally:
            # Whatever happened, the job ends here: nobody else would take it.
            why = outcome.delivered if outcome else why
            if why == "lease_lost":  # nobody else takes an embedded job: this host stalled
                why = "lost its lease: this host stalled longer than runners.lease_seconds"
            abandon(self.db, pair, {"error": f"the embedded runner's job {why}"})

    def _wait(self, pair: tuple[int, int], timeout_ms: int) -> None:
        runners = self.runners
        per_attempt = timeout_ms / 1000 + runners.lease_seconds
        deadline = time.monotonic() + per_attempt * runners.max_attempts + runners.queue_seconds
        while get_job(self.db, pair).state not in TERMINAL:
            if time.monotonic() >= deadline:
                why = "no runner finished it within its timeout and runners.queue_seconds"
                if abandon(self.db, pair, {"error": why}):
                    raise Unavailable(f"worker job {pair[0]}/{pair[1]}: {why}")
            time.sleep(WAIT_STEP_S)

    def _give_up(self, pair: tuple[int, int], exc: BaseException) -> None:
        """Nobody will read the delivery of a job this process stopped waiting for: it
        ends now, so that no runner takes it up (one running it loses its lease)."""
        why = f"the controller stopped waiting for it: {failure_reason(exc)}"
        try:
            abandon(self.db, pair, {"error": why})
        except Exception:  # the wait's own failure is the one to report
            log.exception("worker job %d/%d could not be ended", *pair)

    def delivered(self, pair: tuple[int, int]) -> Delivery:
        stored = get_job(self.db, pair).result or {}
        if "contract" not in stored:
            raise WorkerJobFailed(f"worker job {pair[0]}/{pair[1]}: {stored.get('error')}")
        delivery = Delivery.model_validate(stored)
        result = delivery.result
        if result is not None and result.spawn_error in SHORT_WORDS:
            # The host could not start the command at all: its checks never ran.
            raise ShortOfResources(
                f"worker job {pair[0]}/{pair[1]}: runner {delivery.worker_id} could not start "
                f"the check ({result.spawn_error}); {SHORT_ADVICE}"
            )
        if result is not None:
            return delivery
        assert delivery.error is not None
        if delivery.error.code in TREE_REFUSALS:
            raise Uncheckable(f"a runner cannot write it: {delivery.error.message}")
        raise RequestRejected(delivery.error.code, delivery.error.message, delivery.error.field)


def _holder_runs(worker_id: str) -> bool:
    """Whether the process an embedded job's worker id names (embedded-PID) still runs
    aiworker (this installation's console script, or `python -m aiworker`): then its job
    is no orphan, whatever the wall clock says of its lease."""
    pid = worker_id.removeprefix("embedded-")
    if not pid.isdigit():
        return False
    script = str(Path(sys.executable).with_name("aiworker"))
    running = (runs_with_arguments(int(pid), *argv) for argv in (["-m", "aiworker"], [script]))
    return int(pid) == os.getpid() or any(running)
