"""Artifacts a runner sends to the controller's artifact store under its lease (its
streams' logs): byte ranges against the digest it declared, appended to what was already
received, so a transfer cut by a lost connection or a restarted controller goes on from
there. A payload is published only whole and verified (runtime/artifact_files.py), and a
result that names one is accepted only once it is (fleet.accept)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiworker.contracts.runner import JobResult
from aiworker.core.evidence.artifacts import ArtifactMissing, record_received
from aiworker.errors import InvalidInput
from aiworker.runtime.artifact_files import ArtifactDamaged, ArtifactFiles, is_digest
from aiworker.store.engine import Database
from aiworker.store.worker_job_records import get_job
from aiworker.store.worker_jobs import TERMINAL, LeaseLost

MAX_ARTIFACT_BYTES = 64 * 1024 * 1024


def lease_holds(db: Database, pair: tuple[int, int], token: str, holder: str = "") -> None:
    """Refuse (LeaseLost) a transfer for a job this lease (claimed with the runner token
    HOLDER stands for, when given) no longer holds, or that ended."""
    job = get_job(db, pair)
    claimed_by = (job.claim_key or "").startswith(f"{holder}:") if holder else True
    if job.lease_token != token or job.state in TERMINAL or not claimed_by:
        raise LeaseLost(f"worker job {pair[0]}/{pair[1]} is not held under this lease")


def _digest(digest: str) -> str:
    if not is_digest(digest):
        raise InvalidInput(f"{digest[:80]!r} is not a SHA-256 digest", code="bad_digest")
    return digest


def transfer_state(files: ArtifactFiles, digest: str) -> dict[str, Any]:
    """How much of DIGEST is held, and whether it is published (whole and verified)."""
    _digest(digest)
    return {"received": files.received(digest), "complete": files.has(digest)}


def receive_chunk(
    files: ArtifactFiles, digest: str, offset: int, size: int, data: bytes
) -> dict[str, Any]:
    """Append DATA at OFFSET to the transfer of DIGEST (SIZE bytes in all); the last
    chunk publishes it. A chunk that does not start where the held bytes end is refused
    (offset_mismatch: ask again); bytes that do not hash to DIGEST are dropped
    (artifact_damaged: start again)."""
    _digest(digest)
    if not 1 <= size <= MAX_ARTIFACT_BYTES:
        raise InvalidInput(
            f"an artifact of {size} bytes: 1 to {MAX_ARTIFACT_BYTES} are accepted",
            code="artifact_too_large",
        )
    if files.has(digest):
        return transfer_state(files, digest)
    if files.received(digest) > size:  # more than this payload holds: not its bytes
        files.drop_part(digest)
        raise InvalidInput(f"{digest[:12]}: what was held is dropped", code="offset_mismatch")
    if offset < 0 or offset + len(data) > size:
        raise InvalidInput(f"bytes {offset}+{len(data)} lie outside {size}", code="bad_range")
    try:
        held = files.receive(digest, offset, data)
        if held == size:
            files.complete(digest, size)
    except ValueError as exc:
        raise InvalidInput(str(exc), code="offset_mismatch") from None
    except ArtifactDamaged as exc:
        raise InvalidInput(str(exc), code="artifact_damaged") from None
    return transfer_state(files, digest)


def result_artifacts(
    files: ArtifactFiles | None, result: JobResult, pair: tuple[int, int], days: int
) -> Callable[[Any], object] | None:
    """The writes that record RESULT's artifacts with its job, in the transaction that
    finishes it: one not held whole raises InvalidInput (artifact_incomplete) there, so
    the job is not finished and the runner sends it again."""
    if not result.artifacts:
        return None
    if files is None:
        raise InvalidInput("this controller keeps no artifacts", code="artifact_incomplete")

    def write(connection: Any) -> None:
        try:
            for ref in result.artifacts:
                record_received(connection, files, ref, days, worker_job=f"{pair[0]}/{pair[1]}")
        except ArtifactMissing as exc:
            raise InvalidInput(str(exc), code="artifact_incomplete") from None

    return write
