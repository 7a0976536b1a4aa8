"""The retention pass (`aiworker retention`, and hourly from the tick): what the
artifact store and the git cache keep of tasks that have ended.

- A payload goes once every reference to it has expired (retention.artifact_days after
  it was stored) and each referring task ended at least that long ago; its records stay,
  with their name, digest and size, marked removed. The records are marked and the
  payloads unlinked inside one write transaction, so a step storing the same bytes
  meanwhile writes them again (core/evidence/artifacts.py) and no live record names a
  missing payload.
- The git refs kept for a task (its review's, its refreshed base's) and the evidence
  files earlier versions wrote go once it has ended: a delivered task's at once, a
  failed or cancelled one's after housekeeping.retention_days, like its workspace.
- A transfer nobody has added to for retention.artifact_days is reclaimed.

Each run removes at most retention.batch payloads; `--dry-run` says what a run would
remove and removes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.evidence.artifacts import artifact_files
from aiworker.core.health import Check
from aiworker.core.report import Report
from aiworker.errors import AiworkerError, LockHeld
from aiworker.runtime.artifact_files import RETENTION_STAMP, ArtifactFiles
from aiworker.runtime.git_failures import GitCacheError
from aiworker.runtime.gitcache import GitCache
from aiworker.store.artifacts import (
    live_digests,
    live_totals,
    mark_removed,
    recorded,
    removable,
    serialize_payload_changes,
)
from aiworker.store.cleanup import record_cleanup
from aiworker.store.engine import Database
from aiworker.store.tasks import states_of

log = logging.getLogger(__name__)

ENDED = ("done", "failed", "cancelled")
_EVIDENCE_FILE = re.compile(r"^task-(\d+)-")
MIB = 1 << 20
CHUNK = 500  # digests per IN list
LOCK = "retention"  # held by each pass, and by `db backup --with-artifacts`


@dataclass
class RetentionReport(Report):
    dry_run: bool
    removed: list[dict[str, Any]] = field(default_factory=list)  # payloads: sha256, bytes
    refs: list[dict[str, Any]] = field(default_factory=list)  # task, repository, ref
    files: list[str] = field(default_factory=list)  # evidence files, stale transfers
    freed_bytes: int = 0
    payloads: int = 0  # what the store holds after the run
    bytes: int = 0
    changed: bool = False


def run_retention(env: Environment, *, dry_run: bool = False) -> RetentionReport:
    db = env.open_database()
    try:
        return retention_pass(env, db, dry_run=dry_run)
    finally:
        db.dispose()


def retention_pass(
    env: Environment, db: Database, *, dry_run: bool = False, now: datetime | None = None
) -> RetentionReport:
    now = now or datetime.now(UTC)
    config = env.loaded.config
    days = timedelta(days=config.retention.artifact_days)
    files = artifact_files(env.state_dir)
    report = RetentionReport(dry_run)
    if dry_run:
        with db.read() as session:
            gone = removable(session, now, now - days, config.retention.batch)
        report.removed = [{"sha256": sha, "bytes": size} for sha, size in gone]
        _task_refs_and_evidence(env, db, now, report)
    else:
        # One pass at a time, and none while a backup copies the store (it holds this).
        maintenance = env.locks.lock(LOCK)
        if not maintenance.try_acquire():
            raise LockHeld(f"{LOCK}.lock is held (another pass, or a backup); try again later")
        try:
            settle(db, files)
            report.removed = _remove_payloads(db, files, now, now - days, config.retention.batch)
            _task_refs_and_evidence(env, db, now, report)
        finally:
            maintenance.release()
    for part in files.stale_parts(days.total_seconds(), now.timestamp()):
        report.files.append(str(part))
        if not dry_run:
            with contextlib.suppress(FileNotFoundError):
                report.freed_bytes += part.stat().st_size
                part.unlink()
    report.freed_bytes += sum(r["bytes"] for r in report.removed)
    report.payloads, report.bytes = files.usage()
    report.changed = not dry_run and bool(report.removed or report.refs or report.files)
    if not dry_run:
        _stamp(files.root)
        if report.changed:
            log.info(
                "retention: %d payloads, %d refs, %d files removed (%d bytes)",
                len(report.removed),
                len(report.refs),
                len(report.files),
                report.freed_bytes,
            )
    return report


def _remove_payloads(
    db: Database, files: ArtifactFiles, now: datetime, ended_before: datetime, limit: int
) -> list[dict[str, Any]]:
    """Mark the records and move the payloads aside in one write transaction (a step
    storing the same bytes meanwhile waits for it, then finds them gone and writes them
    again); free them once it committed, put them back when it did not (a full disk)."""
    moved: list[str] = []
    removed = []
    old = files.written_before(ended_before.timestamp())
    try:
        with db.write() as session:
            serialize_payload_changes(session)
            gone = removable(session, now, ended_before, limit)
            mark_removed(session, [sha for sha, _ in gone], now)
            for sha, _size in gone:
                removed.append({"sha256": sha, "bytes": files.discard(sha)})
                moved.append(sha)
            # Payloads no record names (their step failed between storing and recording)
            # once older than the window.
            for start in range(0, len(old), CHUNK):
                chunk = old[start : start + CHUNK]
                for sha in sorted(set(chunk) - recorded(session, chunk)):
                    if len(moved) >= 2 * limit:
                        break
                    removed.append({"sha256": sha, "bytes": files.discard(sha)})
                    moved.append(sha)
    except BaseException:
        for sha in moved:
            files.undiscard(sha)
        raise
    for sha in moved:
        files.purge(sha)
    return removed


def settle(db: Database, files: ArtifactFiles) -> None:
    """Payloads a pass moved aside and then died: back where a live record names them,
    else freed."""
    aside = files.discarded()
    if not aside:
        return
    with db.read() as session:
        live = live_digests(session)
    for sha in aside:
        if sha in live:
            files.undiscard(sha)
        else:
            files.purge(sha)


def _stamp(root: Path) -> None:
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    (root / RETENTION_STAMP).touch()
    os.utime(root / RETENTION_STAMP)


def _task_refs(env: Environment, cache: GitCache) -> dict[int, list[tuple[int, str]]]:
    """The refs the git cache keeps for tasks: task id -> (repository index, ref)."""
    refs: dict[int, list[tuple[int, str]]] = {}
    for repo in env.loaded.config.repositories:
        try:
            for task_id, names in cache.task_refs(repo.index).items():
                refs.setdefault(task_id, []).extend((repo.index, n) for n in names)
        except GitCacheError as exc:
            log.warning("retention: repository %d: %s", repo.index, exc)
    return refs


def _task_refs_and_evidence(
    env: Environment, db: Database, now: datetime, report: RetentionReport
) -> None:
    cache = GitCache(env.state_dir)
    refs = _task_refs(env, cache)
    evidence = env.state_dir / "evidence"
    written: dict[int, list[Path]] = {}
    for path in sorted(evidence.iterdir()) if evidence.is_dir() else []:
        match = _EVIDENCE_FILE.match(path.name)
        if match and path.is_file() and not path.is_symlink():
            written.setdefault(int(match.group(1)), []).append(path)
    if not refs and not written:
        return
    with db.read() as session:
        states = states_of(session, sorted({*refs, *written}))
    kept_for = timedelta(days=env.loaded.config.housekeeping.retention_days)
    for task_id, (state, updated_at) in sorted(states.items()):
        if state not in ENDED or (state != "done" and now - updated_at < kept_for):
            continue
        for index, ref in refs.get(task_id, []):
            if not report.dry_run:
                try:
                    cache.delete_ref(index, ref)
                except GitCacheError as exc:  # a stale ref lock: the next pass tries again
                    log.warning("retention: %s stays: %s", ref, exc)
                    continue
            report.refs.append({"task": task_id, "repository": index, "ref": ref})
        for path in written.get(task_id, []):
            report.files.append(str(path))
            if not report.dry_run:
                _remove_evidence(db, task_id, state, path, report)


def _remove_evidence(
    db: Database, task_id: int, state: str, path: Path, report: RetentionReport
) -> None:
    with contextlib.suppress(FileNotFoundError):
        size = path.stat().st_size
        path.unlink()
        report.freed_bytes += size
        with db.write() as session:
            record_cleanup(session, task_id, str(path), "removed", state, size)


def store_summary(env: Environment, db: Database) -> dict[str, int]:
    """What the artifact store holds and what the next retention pass would remove."""
    config = env.loaded.config
    now = datetime.now(UTC)
    with db.read() as session:
        ahead = removable(
            session,
            now,
            now - timedelta(days=config.retention.artifact_days),
            config.retention.batch,
        )
        payloads, size = live_totals(session)
    return {
        "payloads": payloads,
        "bytes": size,
        "removable": len(ahead),
        "removable_bytes": sum(b for _, b in ahead),
    }


def artifacts_check(env: Environment) -> Check:
    try:
        db = env.open_database()
        try:
            summary = store_summary(env, db)
        finally:
            db.dispose()
    except AiworkerError as exc:
        return Check("artifacts", "warn", f"the artifact store's records cannot be read: {exc}")
    return Check(
        "artifacts",
        "ok",
        f"{summary['payloads']} payloads, {summary['bytes'] / MIB:.1f} MiB; the next retention "
        f"pass removes {summary['removable']} ({summary['removable_bytes'] / MIB:.1f} MiB)",
    )
