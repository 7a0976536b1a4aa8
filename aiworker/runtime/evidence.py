"""Bounded evidence of one output stream: byte count, SHA-256 of every byte, the tail,
and (when asked) a log file of the stream's first LOG_BYTES bytes.

Memory stays O(tail size) whatever the job prints; the log goes to disk as it comes.
Secret values are masked in the kept tail and log; the hash always covers the raw bytes.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

DEFAULT_TAIL_BYTES = 64 * 1024
MASK = b"***"
log = logging.getLogger(__name__)
# A secret cut by the start of the tail is masked when at least this much of it shows.
MIN_PARTIAL_SECRET = 4


@dataclass(frozen=True)
class StreamDigest:
    total_bytes: int
    sha256: str
    tail: bytes
    truncated: bool
    masked: bool
    # The stream's first bytes (masked), kept to be sent to the artifact store; None when
    # no log was asked for or nothing was printed.
    log: Path | None = None

    def as_contract(self) -> dict[str, object]:
        return {
            "total_bytes": self.total_bytes,
            "sha256": self.sha256,
            "tail_base64": base64.b64encode(self.tail).decode("ascii"),
            "tail_bytes": len(self.tail),
            "truncated": self.truncated,
            "masked": self.masked,
        }


class StreamRecorder:
    """Feed chunks in order; call finish() once at the end."""

    def __init__(
        self, tail_bytes: int = DEFAULT_TAIL_BYTES, log: Path | None = None, log_bytes: int = 0
    ) -> None:
        if tail_bytes < 0 or log_bytes < 0:
            raise ValueError("tail and log sizes must not be negative")
        self.tail_limit = tail_bytes
        self._hash = hashlib.sha256()
        self._total = 0
        self._tail = bytearray()
        self._log_path = log if log_bytes else None
        self._log_limit = log_bytes
        self._log = _create_private(self._log_path) if self._log_path is not None else None

    def feed(self, chunk: bytes) -> None:
        self._hash.update(chunk)
        if self._log is not None and self._total < self._log_limit:
            try:
                self._log.write(chunk[: self._log_limit - self._total])
            except OSError as exc:  # a full disk costs the log, never the job
                log.warning("%s is not kept: %s", self._log_path, exc.strerror or exc)
                self.discard()
        self._total += len(chunk)
        if self.tail_limit == 0:
            return
        if len(chunk) >= self.tail_limit:
            self._tail = bytearray(chunk[-self.tail_limit :])
            return
        self._tail += chunk
        # Trim in batches so a stream of small writes is not O(n * tail).
        if len(self._tail) >= 2 * self.tail_limit:
            del self._tail[: len(self._tail) - self.tail_limit]

    def finish(self, secrets: list[bytes] | None = None) -> StreamDigest:
        tail = bytes(self._tail[-self.tail_limit :]) if self.tail_limit else b""
        masked_tail = mask_secrets(tail, secrets or [])
        return StreamDigest(
            total_bytes=self._total,
            sha256=self._hash.hexdigest(),
            tail=masked_tail,
            truncated=self._total > len(tail),
            masked=masked_tail != tail,
            log=self._finish_log(secrets or []),
        )

    def discard(self) -> None:
        """Close and remove the log (a job that did not end normally, a write that
        failed); nothing is kept of it."""
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None

    def _finish_log(self, secrets: list[bytes]) -> Path | None:
        """The log, masked in place through the descriptor it was written with (it is at
        most LOG_BYTES, read once at the end)."""
        handle, path = self._log, self._log_path
        if handle is None or path is None:
            return None
        if self._total == 0:
            self.discard()
            return None
        try:
            handle.flush()
            handle.seek(0)
            data = handle.read()
            masked = replace_secrets(data, secrets)
            if self._total > len(data):
                masked = mask_head(masked, secrets)
            if masked != data:
                handle.seek(0)
                handle.write(masked)
                handle.truncate()
            handle.close()
        except OSError as exc:
            log.warning("%s is not kept: %s", path, exc.strerror or exc)
            self.discard()
            return None
        self._log = None
        return path


def _create_private(path: Path) -> BinaryIO:
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o600), "w+b")


def mask_head(data: bytes, secrets: list[bytes]) -> bytes:
    """A log cut after its first bytes may end in the middle of a secret: mask the
    visible start of it (at least MIN_PARTIAL_SECRET bytes of it)."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        for keep in range(len(secret) - 1, min(MIN_PARTIAL_SECRET, len(secret)) - 1, -1):
            if data.endswith(secret[:keep]):
                return data[:-keep] + MASK
    return data


def replace_secrets(data: bytes, secrets: list[bytes]) -> bytes:
    """Every whole occurrence of each secret, longest first."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        data = data.replace(secret, MASK)
    return data


def mask_secrets(data: bytes, secrets: list[bytes]) -> bytes:
    """Mask every declared secret, whatever its length: the request named it a secret, so a
    short one is masked too even where that hides ordinary text. The floor is one byte (an
    empty value cannot be found)."""
    data = replace_secrets(data, secrets)
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        # The tail may begin in the middle of a secret: mask the visible end of it.
        for keep in range(len(secret) - 1, min(MIN_PARTIAL_SECRET, len(secret)) - 1, -1):
            if data.startswith(secret[-keep:]):
                data = MASK + data[keep:]
                break
    return data
