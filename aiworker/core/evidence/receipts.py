"""A check's receipt as people open it: the record the gate wrote (what ran, at which
head and base, how it ended, its streams' digests and masked tails), read back for the
web plane's receipt page, and the address the CI status links to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiworker.config.models import Config
from aiworker.core.context import Environment
from aiworker.core.evidence.artifacts import artifact_files
from aiworker.core.report import Report
from aiworker.store.artifacts import artifacts_of_receipt, references_to
from aiworker.store.receipts import get_receipt


@dataclass
class ReceiptReport(Report):
    id: int
    task: int | None
    phase: str
    check_id: str | None
    outcome: str
    head: str
    base: str
    created_at: str
    body: dict[str, Any] = field(default_factory=dict)
    # What the artifact store keeps of it: name, sha256, size, media type, removed_at.
    artifacts: list[dict[str, Any]] = field(default_factory=list)


def receipt_url(config: Config, receipt_id: int) -> str:
    """The receipt page under `web.public_url`; empty (no link at all) without one: a
    path on the controller's disk is no link anybody else can open."""
    public = config.web.public_url
    return f"{public}/receipts/{receipt_id}" if public else ""


def show_receipt(env: Environment, receipt_id: int) -> ReceiptReport | None:
    """Receipt RECEIPT_ID as recorded, or None when there is none."""
    db = env.open_database()
    try:
        with db.read() as session:
            receipt = get_receipt(session, receipt_id)
            if receipt is None:
                return None
            return ReceiptReport(
                receipt.id,
                receipt.task_id,
                receipt.phase,
                receipt.check_id,
                receipt.outcome,
                receipt.head_commit,
                receipt.base_commit,
                receipt.created_at.isoformat(),
                dict(receipt.body or {}),
                [a.to_json() for a in artifacts_of_receipt(session, receipt.id)],
            )
    finally:
        db.dispose()


@dataclass(frozen=True)
class Payload:
    sha256: str
    media_type: str
    data: bytes


def open_artifact(env: Environment, digest: str) -> Payload | None:
    """The payload named DIGEST with the media type it was recorded with, verified; None
    when no record names it or the retention pass has removed it. A payload whose bytes
    no longer match raises ArtifactDamaged."""
    db = env.open_database()
    try:
        with db.read() as session:
            present = [r for r in references_to(session, digest) if r.removed_at is None]
    finally:
        db.dispose()
    if not present:
        return None
    try:
        data = artifact_files(env.state_dir).read(digest)
    except FileNotFoundError:
        return None
    return Payload(digest, present[0].media_type, data)
