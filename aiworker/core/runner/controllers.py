"""What a runner needs of the controller, two ways: over the runner API (a runner on any
host, here) and in process (the embedded runner, when no fleet is configured:
local_controller.py). Both answer with the same documents and raise the same errors
(adapters/runner_api.py). A runner host imports this module, never the store."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Protocol

from aiworker.adapters.runner_api import RunnerApi, ServerUnavailable, TooLarge
from aiworker.core.runner.materialise import Fetcher, SnapshotRejected
from aiworker.core.runner.snapshots import MANIFEST

log = logging.getLogger(__name__)


class Controller(Protocol):
    def health(self) -> tuple[dict[str, Any], float | None]: ...

    def claim(self, body: dict[str, Any]) -> dict[str, Any] | None: ...

    def heartbeat(self, pair: tuple[int, int], token: str, timeout_s: float) -> str: ...

    def finish(
        self, pair: tuple[int, int], kind: str, token: str, body: dict[str, Any]
    ) -> dict[str, Any]: ...

    def release(self, pair: tuple[int, int], token: str) -> None: ...

    def fetcher(
        self, repository_index: int, snapshot_id: str, lease: str, cancel: threading.Event
    ) -> Fetcher: ...

    # Sending an artifact (runner/uploads.py): how much is held, then the rest in chunks.
    def artifact_state(self, pair: tuple[int, int], token: str, digest: str) -> dict[str, Any]: ...

    def send_chunk(
        self, pair: tuple[int, int], token: str, digest: str, at: tuple[int, int], data: bytes
    ) -> dict[str, Any]: ...


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

    def artifact_state(self, pair: tuple[int, int], token: str, digest: str) -> dict[str, Any]:
        return self.api.artifact_state(pair, token, digest)

    def send_chunk(
        self, pair: tuple[int, int], token: str, digest: str, at: tuple[int, int], data: bytes
    ) -> dict[str, Any]:
        return self.api.send_chunk(pair, token, digest, at, data)

    def fetcher(
        self, repository_index: int, snapshot_id: str, lease: str, cancel: threading.Event
    ) -> Fetcher:
        prefix = f"/snapshots/{repository_index}/{snapshot_id}"
        return _RemoteFetcher(self.api, prefix, lease, cancel)


class _RemoteFetcher:
    """A snapshot's files from the controller. A download the network or a restarting
    controller broke is tried again (its partial file removed first): a brief hiccup must
    not end the job as failed; one that lasts does, after the last try, and none is tried
    again once the job is stopped (CANCEL: its lease went, or the runner stops)."""

    TRIES = 4  # waiting 1, 2, then 4 s between them

    def __init__(self, api: RunnerApi, prefix: str, lease: str, cancel: threading.Event) -> None:
        self.api, self.prefix, self.lease, self.cancel = api, prefix, lease, cancel

    def manifest(self, limit: int) -> bytes:
        try:
            return self._again(f"{self.prefix}/{MANIFEST}", limit, None)
        except TooLarge as exc:
            raise SnapshotRejected("snapshot_too_large", str(exc)) from None

    def pack(self, number: int, dest: Path, limit: int) -> None:
        try:
            self._again(f"{self.prefix}/pack-{number}", limit, dest)
        except TooLarge as exc:
            raise SnapshotRejected("snapshot_checksum_mismatch", str(exc)) from None

    def _again(self, path: str, limit: int, dest: Path | None) -> bytes:
        for attempt in range(self.TRIES):
            try:
                return self.api.download(path, limit, dest, self.lease)
            except ServerUnavailable as exc:
                if dest is not None:
                    dest.unlink(missing_ok=True)  # a part of it is no use
                if attempt == self.TRIES - 1 or self.cancel.wait(2**attempt):
                    raise
                log.warning("downloading %s broke (%s); trying again", path, exc.message)
        raise AssertionError("unreachable")  # the last try returns or raises


TOKEN_VARIABLE = "AIWORKER_SERVER_TOKEN"  # noqa: S105 (a variable name, not a token)


def remote_controller(server: str, timeout_s: float = 10.0) -> RemoteController:
    """The controller at SERVER (http or https, no path), with the token from
    AIWORKER_SERVER_TOKEN, the runner's only credential."""
    import os

    from aiworker.config.origins import http_origin
    from aiworker.errors import InvalidInput
    from aiworker.secrets import TOKEN, TOKEN_RULE, register_secret

    server = http_origin(server, "--server", code="bad_server")
    token = os.environ.get(TOKEN_VARIABLE, "").strip()
    if not token:
        raise InvalidInput(f"{TOKEN_VARIABLE} is not set: the runner's token is read from it")
    if not TOKEN.match(token):
        raise InvalidInput(f"{TOKEN_VARIABLE} is malformed: expected {TOKEN_RULE}")
    register_secret(token)  # masked wherever it might show: logs, errors, jobs' evidence
    return RemoteController(RunnerApi(server, token, timeout_s))
