"""The runner's client of the controller's runner API (`/api/runner/v1/...`).

Every call has a deadline; a transport failure or a 5xx is ServerUnavailable (try again
later), 401 is Unauthorized (never retried), 409 LeaseGone (final for that lease), 400
Rejected. Downloads stop at their declared size.
"""

from __future__ import annotations

import json
import os
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, NoReturn

import requests

from aiworker.adapters.causes import connection_cause
from aiworker.errors import AiworkerError, InvalidInput, Refused, Unavailable

API = "/api/runner/v1"
LEASE_HEADER = "X-Aiworker-Lease"  # a snapshot is served to the lease that needs it
CALL_TIMEOUT_S = 10.0
SLOWEST_UPLINK = 8 * 1024  # bytes a second an upload is given time for
# An artifact goes in chunks of at most this: a chunk and its request stay under the
# runner API's 1 MiB body bound.
CHUNK_BYTES = 512 * 1024


class ServerUnavailable(Unavailable):
    code = "server_unavailable"


class Unauthorized(Refused):
    code = "unauthorized"


class LeaseGone(AiworkerError):
    code = "lease_lost"


class Rejected(InvalidInput):
    pass


class TooLarge(Exception):
    """A download went past its declared size."""


class RunnerApi:
    def __init__(self, server: str, token: str, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.base = server.rstrip("/") + API
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.session.trust_env = False  # no proxy or netrc decides where the token goes

    def close(self) -> None:
        self.session.close()

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout_s: float | None = None,
        **more: Any,  # data, params, headers: a transfer's raw bytes
    ) -> requests.Response:
        try:
            response = self.session.request(
                method, self.base + path, json=body, timeout=timeout_s or self.timeout_s, **more
            )
        except requests.RequestException as exc:
            raise self._unreachable(self.base + path, exc, timeout_s) from None
        if response.status_code >= 500:
            raise ServerUnavailable(f"{self.base}{path}: HTTP {response.status_code}")
        if response.status_code == 401:
            self._refused(response, path)
        if response.status_code in (400, 404, 409, 413, 422):
            error = _error_of(response, self.base + path)
            kind = LeaseGone if response.status_code == 409 else Rejected
            raise kind(error["message"], code=error["code"])
        if response.status_code >= 400:
            raise Rejected(f"{self.base}{path}: HTTP {response.status_code}")
        return response

    def health(self) -> tuple[dict[str, Any], float | None]:
        """The server's health document and its clock's offset from ours, in seconds."""
        response = self._call("GET", "/health")
        offset = None
        if "Date" in response.headers:
            from datetime import UTC, datetime

            server = parsedate_to_datetime(response.headers["Date"])
            offset = (server - datetime.now(UTC)).total_seconds()
        return response.json(), offset

    def claim(self, body: dict[str, Any]) -> dict[str, Any] | None:
        wait_s = body.get("wait_ms", 0) / 1000
        response = self._call("POST", "/claim", body, timeout_s=self.timeout_s + wait_s)
        if response.status_code == 204:
            return None
        document: dict[str, Any] = response.json()
        return document

    def heartbeat(self, pair: tuple[int, int], token: str, timeout_s: float) -> str:
        path = f"/jobs/{pair[0]}/{pair[1]}/heartbeat"
        wait = max(0.1, min(self.timeout_s, timeout_s))
        answer = self._call("POST", path, {"lease_token": token}, timeout_s=wait)
        return str(answer.json()["lease_expires_at"])

    def finish(
        self, pair: tuple[int, int], kind: str, token: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        path = f"/jobs/{pair[0]}/{pair[1]}/{kind}"
        document = {"lease_token": token, **body}
        slow = max(self.timeout_s, len(json.dumps(document)) / SLOWEST_UPLINK)  # its tails
        return self._call("POST", path, document, timeout_s=slow).json()  # type: ignore[no-any-return]

    def artifact_state(self, pair: tuple[int, int], token: str, digest: str) -> dict[str, Any]:
        """How much of artifact DIGEST the controller holds for the job of lease TOKEN."""
        path = f"/jobs/{pair[0]}/{pair[1]}/artifacts/{digest}"
        return self._call("GET", path, headers={LEASE_HEADER: token}).json()  # type: ignore[no-any-return]

    def send_chunk(
        self, pair: tuple[int, int], token: str, digest: str, at: tuple[int, int], data: bytes
    ) -> dict[str, Any]:
        """DATA of artifact DIGEST from byte AT[0] (AT[1] bytes in all)."""
        path = f"/jobs/{pair[0]}/{pair[1]}/artifacts/{digest}"
        headers = {LEASE_HEADER: token, "Content-Type": "application/octet-stream"}
        params = {"offset": at[0], "size": at[1]}
        # A chunk on a slow uplink takes its time: the limit grows with its size.
        slow = max(self.timeout_s, len(data) / SLOWEST_UPLINK)
        answer = self._call("PUT", path, data=data, params=params, headers=headers, timeout_s=slow)
        return answer.json()  # type: ignore[no-any-return]

    def download(
        self, path: str, limit: int, dest: Path | None = None, lease: str | None = None
    ) -> bytes:
        """GET PATH, at most LIMIT bytes, into DEST (returns b"") or into memory; LEASE,
        the lease proof of the job that needs it, goes along as LEASE_HEADER."""
        headers = {LEASE_HEADER: lease} if lease else None
        try:
            response = self.session.get(
                self.base + path, stream=True, timeout=self.timeout_s, headers=headers
            )
        except requests.RequestException as exc:
            raise self._unreachable(self.base + path, exc) from None
        with response:
            if response.status_code != 200:
                self._raise_for(response, path)
            size = 0
            chunks: list[bytes] = []
            handle = _create_new(dest) if dest is not None else None
            try:
                for chunk in response.iter_content(1 << 20):
                    size += len(chunk)
                    if size > limit:
                        raise TooLarge(f"{path} is longer than {limit} bytes")
                    if handle is not None:
                        handle.write(chunk)
                    else:
                        chunks.append(chunk)
            except requests.RequestException as exc:
                raise self._unreachable(self.base + path, exc) from None
            finally:
                if handle is not None:
                    handle.close()
        return b"".join(chunks)

    def _unreachable(
        self, url: str, exc: requests.RequestException, timeout_s: float | None = None
    ) -> ServerUnavailable:
        """The call to URL failed on its way: why, in an operator's words."""
        why, _ = connection_cause(exc, timeout_s or self.timeout_s)
        return ServerUnavailable(f"{url}: {why}")

    def _raise_for(self, response: requests.Response, path: str) -> None:
        if response.status_code >= 500:
            raise ServerUnavailable(f"{self.base}{path}: HTTP {response.status_code}")
        if response.status_code == 401:
            self._refused(response, path)
        error = _error_of(response, self.base + path)
        raise Rejected(error["message"], code=error["code"])

    def _refused(self, response: requests.Response, path: str) -> NoReturn:
        """A 401: the runner API refusing the token, or something else at the address
        (a forge answers 401 for a path it does not know): said as what it is."""
        error = _error_of(response, self.base + path)
        if error["code"] == "http_error":
            raise Rejected(error["message"], code=error["code"])
        raise Unauthorized(f"{self.base}: the runner token is not accepted")


def _create_new(path: Path) -> Any:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o600), "wb")


def _error_of(response: requests.Response, url: str) -> dict[str, str]:
    """The runner API's error document in RESPONSE; an answer of another shape is from
    something else at URL (the operator's listener, the forge, a proxy), and says so."""
    try:
        error = response.json()["error"]
        return {"code": str(error["code"])[:80], "message": str(error["message"])[:500]}
    except (ValueError, KeyError, TypeError):
        message = (
            f"{url}: HTTP {response.status_code} that is not from aiworker's runner API "
            "(is --server the address `web serve --runner-listen` gives?)"
        )
        return {"code": "http_error", "message": message}
