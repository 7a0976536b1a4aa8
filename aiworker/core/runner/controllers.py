"""What a runner needs of the controller, two ways: over the runner API (a runner on any
host) and in process (the embedded runner, when no fleet is configured). Both answer
with the same documents and raise the same errors (adapters/runner_api.py)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from aiworker.adapters.runner_api import LeaseGone, RunnerApi, TooLarge
from aiworker.config.models import Runners
from aiworker.core.runner.fleet import CONTRACTS, accept, lease_document
from aiworker.core.runner.materialise import Fetcher, SnapshotRejected
from aiworker.core.runner.snapshots import MANIFEST, create_new, pack_path, snapshot_dir
from aiworker.store.engine import Database
from aiworker.store.worker_job_records import release
from aiworker.store.worker_jobs import LeaseLost, claim, heartbeat


class Controller(Protocol):
    def health(self) -> tuple[dict[str, Any], float | None]: ...

    def claim(self, body: dict[str, Any]) -> dict[str, Any] | None: ...

    def heartbeat(self, pair: tuple[int, int], token: str, timeout_s: float) -> str: ...

    def finish(
        self, pair: tuple[int, int], kind: str, token: str, body: dict[str, Any]
    ) -> dict[str, Any]: ...

    def release(self, pair: tuple[int, int], token: str) -> None: ...

    def fetcher(self, repository_index: int, snapshot_id: str, lease: str) -> Fetcher: ...


class RemoteController:
    """The runner API of a controller at SERVER."""

    def __init__(self, api: RunnerApi) -> None:
        self.api = api

    def health(self) -> tuple[dict[str, Any], float | None]:
        return self.api.health()

    def claim(self, body: dict[str, Any]) -> dict[str, Any] | None:
        return self.api.claim(body)

    def heartbeat(self, pair: tuple[int, int], token: str, timeout_s: float) -> str:
        return self.api.heartbeat(pair, token, timeout_s)

    def finish(
        self, pair: tuple[int, int], kind: str, token: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        return self.api.finish(pair, kind, token, body)

    def release(self, pair: tuple[int, int], token: str) -> None:
        self.api.finish(pair, "release", token, {})

    def fetcher(self, repository_index: int, snapshot_id: str, lease: str) -> Fetcher:
        return _RemoteFetcher(self.api, f"/snapshots/{repository_index}/{snapshot_id}", lease)


class _RemoteFetcher:
    def __init__(self, api: RunnerApi, prefix: str, lease: str) -> None:
        self.api, self.prefix, self.lease = api, prefix, lease

    def manifest(self, limit: int) -> bytes:
        try:
            return self.api.download(f"{self.prefix}/{MANIFEST}", limit, lease=self.lease)
        except TooLarge as exc:
            raise SnapshotRejected("snapshot_too_large", str(exc)) from None

    def pack(self, number: int, dest: Path, limit: int) -> None:
        try:
            self.api.download(f"{self.prefix}/pack-{number}", limit, dest, self.lease)
        except TooLarge as exc:
            raise SnapshotRejected("snapshot_checksum_mismatch", str(exc)) from None


class LocalController:
    """The controller's own store and snapshots, for the embedded runner."""

    def __init__(self, db: Database, state_dir: Path, runners: Runners) -> None:
        self.db, self.state_dir, self.runners = db, state_dir, runners

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
            status, delivery = accept(self.db, pair, token, kind, body)
        except LeaseLost as exc:
            raise LeaseGone(str(exc)) from None
        return {"status": status, "delivery": delivery}

    def release(self, pair: tuple[int, int], token: str) -> None:
        release(self.db, pair, token)

    def fetcher(self, repository_index: int, snapshot_id: str, lease: str) -> Fetcher:
        del lease  # in process: the files are the controller's own
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


TOKEN_VARIABLE = "AIWORKER_SERVER_TOKEN"  # noqa: S105 (a variable name, not a token)


def remote_controller(server: str, timeout_s: float = 10.0) -> RemoteController:
    """The controller at SERVER (http or https, no path), with the token from
    AIWORKER_SERVER_TOKEN, the runner's only credential."""
    import os
    from urllib.parse import urlsplit

    from aiworker.errors import InvalidInput

    parts = urlsplit(server)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise InvalidInput(f"--server {server!r} must be http(s)://HOST[:PORT]", code="bad_server")
    token = os.environ.get(TOKEN_VARIABLE, "").strip()
    if not token:
        raise InvalidInput(f"{TOKEN_VARIABLE} is not set: the runner's token is read from it")
    return RemoteController(RunnerApi(server, token, timeout_s))
