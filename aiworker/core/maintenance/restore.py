"""`aiworker restore --from BACKUP [--artifacts DIR]`: bring an installation back from
`db backup --with-artifacts` into an empty state directory, then check it before any
new work starts.

In order, holding maintenance.lock of the new state directory (no tick starts work
meanwhile): the snapshot is checked (SQLite, intact, a schema this version knows) and
copied in as one consistent file (0600, in a 0700 directory) and migrated to this
version's schema; every payload its records name is copied from DIR and verified
(one missing or damaged there leaves its records, marked removed); the claims and
attempts the old host held are recovered as a dead job's are; and every task that has
not ended is checked against the forge (restore_check.py): it carries on, or it is
held, paused with the reason, until an operator resumes it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiworker.core.context import RESTORING, Environment
from aiworker.core.evidence.artifacts import artifact_files, copy_payloads
from aiworker.core.maintenance.backup import MANIFEST
from aiworker.core.report import Report
from aiworker.errors import InvalidInput
from aiworker.runtime.artifact_files import ArtifactFiles
from aiworker.runtime.atomic import fsync_directory, write_private_file
from aiworker.runtime.interrupts import ignore_signals
from aiworker.store.artifacts import live_digests, mark_removed
from aiworker.store.backup import (
    NotASnapshot,
    backup_sqlite,
    snapshot_revision,
    snapshot_sha256,
)
from aiworker.store.engine import Database, default_url, sqlite_path
from aiworker.store.schema import ensure_not_newer, upgrade

log = logging.getLogger(__name__)
LOCKS = "locks"  # LockDir's folder in a state directory
# What a state directory may hold before a restore, and keeps after one that failed: its
# locks, and the scheduler's state (an operator pauses before restoring, so that no tick
# starts work on what was restored before they looked at it).
KEPT = (LOCKS, "scheduler.json")


@dataclass
class RestoreReport(Report):
    state_dir: str
    restored_from: str
    revision: str | None = None  # the snapshot's; the store is migrated to this version's
    artifacts: dict[str, Any] = field(default_factory=dict)
    recovered: list[dict[str, Any]] = field(default_factory=list)
    tasks: list[dict[str, Any]] = field(default_factory=list)  # task, state, outcome, reason


def _refuse_unless_restorable(env: Environment, backup: Path, artifacts: Path | None) -> None:
    if env.loaded.config.database.url and env.database_url != default_url(env.state_dir):
        raise InvalidInput(
            "restore writes the SQLite store in the state directory; database.url names "
            "another database (restore PostgreSQL with its own tools)"
        )
    if env.state_dir.exists():
        if not env.state_dir.is_dir():
            raise InvalidInput(f"state directory {env.state_dir} is not a directory")
        _refuse_unless_empty(env.state_dir)
    if not backup.is_file():
        raise InvalidInput(f"--from {backup}: no such file")
    if artifacts is not None and not artifacts.is_dir():
        raise InvalidInput(f"--artifacts {artifacts}: no such directory")
    if artifacts is not None and not (artifacts / MANIFEST).is_file():
        raise InvalidInput(
            f"--artifacts {artifacts} has no {MANIFEST}: the backup that filled it did not "
            "finish; use a complete one"
        )


def _refuse_another_snapshot_s(artifacts: Path, backup: Path) -> None:
    """ARTIFACTS must hold the payloads of BACKUP itself: another backup's folder would
    leave the records it lacks marked removed, its evidence dropped for good."""
    try:
        manifest = json.loads((artifacts / MANIFEST).read_bytes())
        paired = manifest.get("snapshot_sha256")
    except (OSError, ValueError, AttributeError) as exc:
        raise InvalidInput(f"--artifacts {artifacts}: {MANIFEST} is unreadable: {exc}") from None
    try:
        own = snapshot_sha256(backup)
    except OSError as exc:
        raise InvalidInput(f"--from {backup}: {exc.strerror}") from None
    if paired is not None and paired != own:
        raise InvalidInput(
            f"--artifacts {artifacts} holds the payloads of another snapshot "
            f"({str(manifest.get('snapshot'))[:200]}), not of --from {backup}: give the "
            "folder that backup filled"
        )


def _refuse_unless_empty(state_dir: Path) -> None:
    """Only its lock files (a refused or failed restore's) and a pause the operator set
    before restoring may be there."""
    present = sorted(set(os.listdir(state_dir)) - set(KEPT))
    if present:
        raise InvalidInput(
            f"state directory {state_dir} is not empty ({', '.join(present[:5])}); "
            "restore only into an empty one: a restore never mixes with live state"
        )


def restore(env: Environment, backup: Path, artifacts: Path | None) -> RestoreReport:
    _refuse_unless_restorable(env, backup, artifacts)
    try:
        revision = snapshot_revision(backup)
    except NotASnapshot as exc:
        raise InvalidInput(f"--from: {exc}") from None
    if revision is None:  # another application's database, or an empty one
        raise InvalidInput(f"--from {backup}: not a snapshot of an aiworker store")
    ensure_not_newer(revision)
    if artifacts is not None:
        _refuse_another_snapshot_s(artifacts, backup)
    env.ensure_state_dir()
    # Taken before anything is written and held to the end: a second restore into the
    # same directory is refused having touched nothing.
    maintenance = env.locks.maintenance()
    try:
        _refuse_unless_empty(env.state_dir)  # again: another restore may have ended meanwhile
        try:
            return _restore(env, backup, artifacts, revision)
        except BaseException:
            # The directory was empty: what is in it now this restore made, and it goes,
            # so that the same command can run again once its cause is fixed (a full disk).
            _empty(env.state_dir)
            raise
    finally:
        maintenance.release()


def _restore(
    env: Environment, backup: Path, artifacts: Path | None, revision: str
) -> RestoreReport:
    # Until the check is done no tick starts work here, even after a crash: the marker
    # stays and the tick refuses (remove the directory and restore again).
    marker = env.state_dir / RESTORING
    write_private_file(marker, f"restoring {backup}\n".encode())
    target = sqlite_path(env.database_url)
    assert target is not None
    backup_sqlite(backup, target)
    report = RestoreReport(str(env.state_dir), str(backup), revision)
    db = Database(env.database_url)
    try:
        upgrade(db)
        report.artifacts = _payloads(env, db, artifacts)
        report.recovered = _release_the_old_hosts_claims(env, db)
        from aiworker.core.maintenance.restore_check import verify_tasks

        report.tasks = verify_tasks(env, db)
    finally:
        db.dispose()
    marker.unlink()
    fsync_directory(env.state_dir)
    held = sum(t["outcome"] == "held" for t in report.tasks)
    log.info("restored %s into %s; %d tasks held", backup, env.state_dir, held)
    return report


def _empty(folder: Path) -> None:
    """Remove what the restore made in FOLDER (its lock files stay): the store first, its
    marker last and only when all else went, since without the marker a tick would start
    work on a store never checked. A second signal must not cut it short (the command's
    end puts the handlers back)."""
    ignore_signals()
    made = [p for p in folder.iterdir() if p.name not in (*KEPT, RESTORING)]
    left = False
    for path in sorted(made, key=lambda p: not p.name.startswith("aiworker.db")):
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as exc:
            left = True
            log.warning("restore: cannot remove %s after it failed: %s", path, exc.strerror)
    if not left:
        (folder / RESTORING).unlink(missing_ok=True)


def _payloads(env: Environment, db: Database, folder: Path | None) -> dict[str, Any]:
    with db.read() as session:
        named = live_digests(session)
    source = ArtifactFiles(folder) if folder is not None else None
    copied = copy_payloads(source, artifact_files(env.state_dir), named) if source else None
    lost = sorted(named) if copied is None else copied.missing + copied.damaged
    if lost:
        # Their records stay (names, digests, sizes), marked removed: none names a
        # payload that is not here.
        with db.write() as session:
            mark_removed(session, lost, datetime.now(UTC))
        log.warning("restore: %d payloads the records name are not in the backup", len(lost))
    return {
        "payloads": copied.payloads if copied else 0,
        "bytes": copied.bytes if copied else 0,
        "missing": copied.missing if copied else sorted(named),
        "damaged": copied.damaged if copied else [],
    }


def _release_the_old_hosts_claims(env: Environment, db: Database) -> list[dict[str, Any]]:
    """No job of the old host runs here: its claims and open attempts are recovered as
    a dead job's are (a step retried within its budget, a claim given back)."""
    from aiworker.core.tasks.recovery import recover_attempts, recover_slots

    found = [*recover_slots(env, db, []), *recover_attempts(env, db)]
    return [{"task": r.task, "state": r.state, "reason": r.reason} for r in found]
