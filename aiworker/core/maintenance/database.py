"""Creating, migrating, inspecting and backing up the store."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.report import Report
from aiworker.errors import InvalidInput
from aiworker.secrets import redact_url_password
from aiworker.store.backup import backup_sqlite
from aiworker.store.engine import sqlite_path
from aiworker.store.schema import HEAD_REVISION, current_revision, ensure_not_newer, upgrade

log = logging.getLogger(__name__)


@dataclass
class RevisionReport(Report):
    url: str
    before: str | None
    current: str | None
    head: str

    def to_json(self) -> dict[str, Any]:
        return {
            "database": redact_url_password(self.url),
            "before": self.before,
            "current": self.current,
            "head": self.head,
            "up_to_date": self.current == self.head,
        }


def upgrade_database(env: Environment) -> RevisionReport:
    db = env.open_database(require_current=False)
    try:
        before, after = upgrade(db)
    finally:
        db.dispose()
    log.info("database %s: %s -> %s", redact_url_password(env.database_url), before, after)
    return RevisionReport(env.database_url, before, after, HEAD_REVISION)


def database_revision(env: Environment) -> RevisionReport:
    db = env.open_database(require_current=False)
    try:
        revision = current_revision(db)
    finally:
        db.dispose()
    ensure_not_newer(revision)
    return RevisionReport(env.database_url, revision, revision, HEAD_REVISION)


@dataclass
class BackupReport(Report):
    source: Path
    target: Path
    bytes: int
    revision: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "source": str(self.source),
            "target": str(self.target),
            "bytes": self.bytes,
            "revision": self.revision,
        }


def backup_database(env: Environment, target: Path) -> BackupReport:
    """Snapshot the live SQLite database to TARGET, a new absolute path."""
    if not target.is_absolute():
        raise InvalidInput(f"backup target {target} must be an absolute path")
    if target.exists() or target.is_symlink():
        raise InvalidInput(f"backup target {target} already exists; choose a new path")
    if not target.parent.is_dir():
        raise InvalidInput(f"backup target directory {target.parent} does not exist")
    source = sqlite_path(env.database_url)
    if source is None:
        raise InvalidInput("db backup supports SQLite databases only; use pg_dump for PostgreSQL")
    if not source.is_file():
        raise InvalidInput(f"no database at {source}; run `aiworker db upgrade` first")
    revision = database_revision(env).current
    try:
        size = backup_sqlite(source, target)
    except FileExistsError:
        raise InvalidInput(f"backup target {target} already exists; choose a new path") from None
    log.info("backed up %s to %s (%d bytes)", source, target, size)
    return BackupReport(source, target, size, revision)
