"""Keeping evidence in the artifact store: the payload first (written, verified and
fsynced under its digest), the record naming it after, in the caller's transaction, so
no record ever names a payload that is missing or partial. A write that fails (a full
disk) raises before anything is recorded; the caller's step fails and is retried."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiworker.runtime.artifact_files import ArtifactDamaged, ArtifactFiles
from aiworker.store.artifacts import add_artifact, serialize_payload_changes

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
MARKDOWN = "text/markdown; charset=utf-8"


def artifact_files(state_dir: Path) -> ArtifactFiles:
    return ArtifactFiles(state_dir / "artifacts")


@dataclass(frozen=True)
class Stored:
    """A payload in place, not yet recorded."""

    name: str
    sha256: str
    size: int
    media_type: str
    files: ArtifactFiles = field(repr=False)
    data: bytes = field(repr=False)


def store(files: ArtifactFiles, name: str, data: bytes, media_type: str) -> Stored:
    digest, size = files.put(data)
    return Stored(name, digest, size, media_type, files, data)


def record(
    session: Any,  # the caller's write session (store/)
    stored: Stored,
    days: int,
    *,
    task_id: int | None = None,
    attempt_id: int | None = None,
    receipt_id: int | None = None,
    worker_job: str | None = None,
    now: datetime | None = None,
) -> int:
    """The reference to STORED, kept DAYS from now (and while its task works).

    The retention pass removes payloads inside its own write transaction, so one that
    went between `store` and this write is seen here, under the same write lock, and
    written again: a record never names a missing payload."""
    serialize_payload_changes(session)
    if not stored.files.has(stored.sha256):
        stored.files.put(stored.data)
    refers = {
        "task_id": task_id,
        "attempt_id": attempt_id,
        "receipt_id": receipt_id,
        "worker_job": worker_job,
    }
    return _reference(session, stored, days, now or datetime.now(UTC), refers)


def _reference(session: Any, payload: Any, days: int, now: datetime, refers: dict[str, Any]) -> int:
    """PAYLOAD's record (name, sha256, size, media_type), kept DAYS from NOW."""
    return add_artifact(
        session,
        sha256=payload.sha256,
        size=payload.size,
        media_type=payload.media_type,
        name=payload.name,
        created_at=now,
        expires_at=now + timedelta(days=days),
        **refers,
    )


class ArtifactMissing(Exception):
    """A transfer named a payload the store does not hold (whole)."""


def record_received(
    session: Any,
    files: ArtifactFiles,
    ref: Any,  # an ArtifactRef (contracts/runner.py): name, sha256, size, media_type
    days: int,
    **refers: Any,
) -> int:
    """The reference to a payload a transfer put in place (a runner's log); refused
    (ArtifactMissing) unless the store holds it whole, checked under the same lock the
    retention pass removes under."""
    serialize_payload_changes(session)
    if not files.has(ref.sha256) or files.received(ref.sha256) != ref.size:
        raise ArtifactMissing(f"{ref.name} ({ref.sha256[:12]}) is not in the artifact store")
    return _reference(session, ref, days, datetime.now(UTC), refers)


@dataclass
class Copied:
    payloads: int = 0
    bytes: int = 0
    missing: list[str] = field(default_factory=list)  # named, but not in the source
    damaged: list[str] = field(default_factory=list)  # no longer matching their digest


def copy_payloads(source: ArtifactFiles, target: ArtifactFiles, digests: Iterable[str]) -> Copied:
    """Copy each of DIGESTS from SOURCE to TARGET, verified on both sides (a backup's
    artifacts, or a restore's)."""
    copied = Copied()
    for digest in sorted(digests):
        try:
            data = source.read(digest)
        except FileNotFoundError:
            copied.missing.append(digest)
            continue
        except ArtifactDamaged:
            copied.damaged.append(digest)
            continue
        target.put(data)
        copied.payloads += 1
        copied.bytes += len(data)
    return copied
