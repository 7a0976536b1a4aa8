"""`db backup`: a consistent snapshot of the store, and with it the artifact store's
payloads it names, for `aiworker restore`."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiworker.core.context import Environment, on_a_read_only_mount
from aiworker.core.maintenance.database import database_revision
from aiworker.core.report import Report
from aiworker.errors import FULL_ERRNOS, InvalidInput, LockHeld, Unavailable
from aiworker.runtime.atomic import sweep_abandoned, write_private_file
from aiworker.store.backup import (
    backup_sqlite,
    backup_still_sqlite,
    dump_server,
    snapshot_digests,
    snapshot_revision,
    snapshot_sha256,
)
from aiworker.store.engine import sqlite_path

log = logging.getLogger(__name__)


@dataclass
class BackupReport(Report):
    source: Path | str  # the SQLite file, or the PostgreSQL server and database
    target: Path
    bytes: int
    revision: str | None
    artifacts: dict[str, Any] | None = None  # with --with-artifacts: dir, payloads, bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "target": str(self.target),
            "bytes": self.bytes,
            "revision": self.revision,
            "artifacts": self.artifacts,
        }


def _new_file(target: Path) -> None:
    if not target.is_absolute():
        raise InvalidInput(f"backup target {target} must be an absolute path")
    if target.exists() or target.is_symlink():
        raise InvalidInput(f"backup target {target} already exists; choose a new path")
    if not target.parent.is_dir():
        raise InvalidInput(f"backup target directory {target.parent} does not exist")


def _new_directory(path: Path, what: str) -> None:
    if not path.is_absolute():
        raise InvalidInput(f"{what} {path} must be an absolute path")
    if path.is_symlink() or (path.exists() and (not path.is_dir() or any(path.iterdir()))):
        raise InvalidInput(f"{what} {path} exists and is not an empty directory")
    if not path.parent.is_dir():
        raise InvalidInput(f"{what}'s parent {path.parent} does not exist")


def backup_database(env: Environment, target: Path, artifacts: Path | None = None) -> BackupReport:
    """Snapshot the live SQLite database to TARGET, a new absolute path; with ARTIFACTS
    (a new or empty directory), also every payload the snapshot names, as a consistent
    pair: maintenance.lock and retention.lock are held throughout, so no tick starts
    work and no retention pass removes a payload meanwhile."""
    _new_file(target)
    for leftover in sweep_abandoned(target.parent):
        log.warning("removed %s, left by a backup that was killed", leftover)
    if artifacts is not None:
        _new_directory(artifacts, "--with-artifacts")
        if artifacts == target:
            raise InvalidInput("--to and --with-artifacts name the same path; name two")
    source = sqlite_path(env.database_url)
    if source is None:
        return _dump_server(env, target, artifacts)
    if not source.is_file():
        raise InvalidInput(f"no database at {source}; run `aiworker db upgrade` first")
    # On a file system mounted read-only no lock can be taken and nothing writes through
    # this mount: the files as they lie are the snapshot (refused if they change meanwhile).
    still = on_a_read_only_mount(source.parent)
    revision = None if still else database_revision(env).current
    maintenance, retention = env.locks.lock("maintenance"), env.locks.lock("retention")
    if artifacts is not None and not still:
        maintenance = env.locks.maintenance()
        if not retention.try_acquire():
            maintenance.release()
            raise LockHeld("a retention pass holds retention.lock; try again later")
    try:
        size = _snapshot(source, target, still=still)
        log.info("backed up %s to %s (%d bytes)", source, target, size)
        revision = snapshot_revision(target) if still else revision
        report = BackupReport(source, target, size, revision)
        if artifacts is not None:
            made = not artifacts.exists()
            try:
                report.artifacts = _copy_artifacts(env, target, artifacts, settled=not still)
            except BaseException:
                # A pair or nothing: a snapshot left without its payloads would only
                # block the retry ("already exists").
                target.unlink(missing_ok=True)
                _empty(artifacts, remove=made)
                raise
    finally:
        for lock in (retention, maintenance):
            if lock.held:
                lock.release()
    return report


def _snapshot(source: Path, target: Path, *, still: bool) -> int:
    """backup_sqlite (STILL: backup_still_sqlite, for a read-only mount), its failures
    named: the target taken meanwhile or not creatable there (exit 2), its disk full
    (exit 75)."""
    try:
        return (backup_still_sqlite if still else backup_sqlite)(source, target)
    except FileExistsError:
        raise InvalidInput(f"backup target {target} already exists; choose a new path") from None
    except OSError as exc:
        if exc.errno in FULL_ERRNOS:
            raise Unavailable(f"backup target {target}: the disk is full; free space") from None
        raise InvalidInput(f"backup target {target} cannot be created: {exc.strerror}") from None


def _empty(folder: Path, *, remove: bool) -> None:
    """Remove what a failed backup wrote into FOLDER (and FOLDER itself when it made it)."""
    if remove:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for child in folder.iterdir() if folder.is_dir() else ():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _dump_server(env: Environment, target: Path, artifacts: Path | None) -> BackupReport:
    """A database on a server, dumped with the server's own tool."""
    if artifacts is not None:
        raise InvalidInput(
            "--with-artifacts pairs payloads with a SQLite snapshot for `aiworker restore`; "
            f"with a database server copy {env.state_dir / 'artifacts'} beside the dump"
        )
    revision = database_revision(env).current
    source, size = dump_server(env.database_url, target)
    log.info("dumped %s to %s (%d bytes)", source, target, size)
    return BackupReport(source, target, size, revision)


MANIFEST = "manifest.json"  # written last: a folder without it is no finished backup


def _copy_artifacts(
    env: Environment, snapshot: Path, folder: Path, *, settled: bool
) -> dict[str, Any]:
    """Every payload SNAPSHOT names, copied into FOLDER with a manifest; SETTLED: payloads
    a crashed retention pass moved aside are put back first (not on a read-only mount)."""
    from aiworker.core.evidence.artifacts import artifact_files, copy_payloads
    from aiworker.core.maintenance.retention import settle
    from aiworker.runtime.artifact_files import ArtifactFiles

    live = artifact_files(env.state_dir)
    if settled:
        db = env.open_database()
        try:
            settle(db, live)
        finally:
            db.dispose()
    folder.mkdir(mode=0o700, exist_ok=True)
    copied = copy_payloads(live, ArtifactFiles(folder), snapshot_digests(snapshot))
    if copied.missing or copied.damaged:
        log.warning(
            "backup: %d payloads missing and %d damaged in the live store",
            len(copied.missing),
            len(copied.damaged),
        )
    summary = {"dir": str(folder), **vars(copied)}
    manifest = {
        "snapshot": str(snapshot),
        "snapshot_sha256": snapshot_sha256(snapshot),
        "revision": snapshot_revision(snapshot),
        **summary,
    }
    write_private_file(folder / MANIFEST, json.dumps(manifest, indent=2).encode())
    return summary
