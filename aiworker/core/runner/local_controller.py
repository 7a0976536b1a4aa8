"""The controller's side of the runner protocol in process: the embedded runner (no fleet
configured) claims, renews and finishes worker jobs in the controller's own store and
reads its snapshots from the state directory (controllers.py: the same over HTTP)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from aiworker.adapters.runner_api import LeaseGone
from aiworker.config.models import Runners
from aiworker.core.evidence.artifacts import artifact_files
from aiworker.core.runner.fleet import CONTRACTS, accept, lease_document
from aiworker.core.runner.materialise import Fetcher, SnapshotRejected
from aiworker.core.runner.snapshots import MANIFEST, create_new, pack_path, snapshot_dir
from aiworker.core.runner.transfers import lease_holds, receive_chunk, transfer_state
from aiworker.store.engine import Database
from aiworker.store.worker_job_records import release
from aiworker.store.worker_jobs import LeaseLost, claim, heartbeat


class LocalController:
    """The controller's own store and snapshots, for the embedded runner."""

    def __init__(self, db: Database, state_dir: Path, runners: Runners, days: int = 7) -> None:
        self.db, self.state_dir, self.runners = db, state_dir, runners
        self.files = artifact_files(state_dir)
        self.days = days  # how long a job's artifacts are kept (retention.artifact_days)

    def health(self) -> tuple[dict[str, Any], float | None]:
        return {"ok": True, "contracts": list(CONTRACTS)}, 0.0

    def claim(self, body: dict[str, Any]) -> dict[str, Any] | None:
        exact = body.get("exact")
        indexes: Sequence[int] | None = body.get("repository_indexes")
        lease = claim(
            self.db,
            body["worker_id"],
            body["request_key"],
            lease_for=timedelta(seconds=self.runners.lease_seconds),
            max_attempts=self.runners.max_attempts,
            repository_indexes=indexes,
            exact=(exact["repository_index"], exact["worker_job_index"]) if exact else None,
            repeat_only=bool(body.get("repeat_only")),
        )
        return None if lease is None else lease_document(lease, self.runners.lease_seconds)

    def heartbeat(self, pair: tuple[int, int], token: str, timeout_s: float) -> str:
        del timeout_s  # in process: no transport to wait on
        try:
            lease_for = timedelta(seconds=self.runners.lease_seconds)
            return heartbeat(self.db, pair, token, lease_for).isoformat()
        except LeaseLost as exc:
            raise LeaseGone(str(exc)) from None

    def finish(
        self, pair: tuple[int, int], kind: str, token: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        try:
            status, delivery = accept(self.db, pair, token, kind, body, self.files, self.days)
        except LeaseLost as exc:
            raise LeaseGone(str(exc)) from None
        return {"status": status, "delivery": delivery}

    def artifact_state(self, pair: tuple[int, int], token: str, digest: str) -> dict[str, Any]:
        self._lease_holds(pair, token)
        return transfer_state(self.files, digest)

    def send_chunk(
        self, pair: tuple[int, int], token: str, digest: str, at: tuple[int, int], data: bytes
    ) -> dict[str, Any]:
        self._lease_holds(pair, token)
        return receive_chunk(self.files, digest, at[0], at[1], data)

    def _lease_holds(self, pair: tuple[int, int], token: str) -> None:
        try:
            lease_holds(self.db, pair, token)
        except LeaseLost as exc:
            raise LeaseGone(str(exc)) from None

    def release(self, pair: tuple[int, int], token: str) -> None:
        release(self.db, pair, token)

    def fetcher(
        self, repository_index: int, snapshot_id: str, lease: str, cancel: threading.Event
    ) -> Fetcher:
        del lease, cancel  # in process: the files are the controller's own, read at once
        return _LocalFetcher(snapshot_dir(self.state_dir, repository_index, snapshot_id))


class _LocalFetcher:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def manifest(self, limit: int) -> bytes:
        path = self.folder / MANIFEST
        if not path.is_file():
            raise SnapshotRejected("snapshot_missing", f"no snapshot at {self.folder}")
        if path.stat().st_size > limit:
            raise SnapshotRejected("snapshot_too_large", f"the manifest is over {limit} bytes")
        return path.read_bytes()

    def pack(self, number: int, dest: Path, limit: int) -> None:
        source = pack_path(self.folder, number)
        if not source.is_file() or source.stat().st_size > limit:
            raise SnapshotRejected("snapshot_checksum_mismatch", f"pack {number} is not as listed")
        with open(source, "rb") as src, create_new(dest) as out:
            shutil.copyfileobj(src, out)
