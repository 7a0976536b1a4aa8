"""Bounded evidence of one output stream: byte count, SHA-256 of every byte, the tail.

Memory stays O(tail size) whatever the job prints. Secret values are masked in
the kept tail only; the hash always covers the raw bytes.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

DEFAULT_TAIL_BYTES = 64 * 1024
MASK = b"***"
# A secret cut by the start of the tail is masked when at least this much of it shows.
MIN_PARTIAL_SECRET = 4


@dataclass(frozen=True)
class StreamDigest:
    total_bytes: int
    sha256: str
    tail: bytes
    truncated: bool
    masked: bool

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

    def __init__(self, tail_bytes: int = DEFAULT_TAIL_BYTES) -> None:
        if tail_bytes < 0:
            raise ValueError("tail size must not be negative")
        self.tail_limit = tail_bytes
        self._hash = hashlib.sha256()
        self._total = 0
        self._tail = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._hash.update(chunk)
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
        )


def mask_secrets(data: bytes, secrets: list[bytes]) -> bytes:
    """Mask every declared secret, whatever its length: the request named it a secret, so a
    short one is masked too even where that hides ordinary text. The floor is one byte (an
    empty value cannot be found)."""
    usable = (s for s in secrets if s)
    for secret in sorted(usable, key=len, reverse=True):
        data = data.replace(secret, MASK)
        # The tail may begin in the middle of a secret: mask the visible end of it.
        for keep in range(len(secret) - 1, min(MIN_PARTIAL_SECRET, len(secret)) - 1, -1):
            if data.startswith(secret[-keep:]):
                data = MASK + data[keep:]
                break
    return data
