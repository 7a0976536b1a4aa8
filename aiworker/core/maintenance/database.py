"""Creating, migrating, inspecting and copying the store (backups: backup.py)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from aiworker.core.context import Environment
from aiworker.core.report import Report
from aiworker.errors import InvalidInput, LockHeld
from aiworker.runtime.atomic import write_private_file
from aiworker.secrets import redact_url_password
from aiworker.store.engine import is_sqlite, sqlite_path
from aiworker.store.schema import HEAD_REVISION, current_revision, ensure_not_newer, upgrade
from aiworker.store.tasks import open_attempt_jobs

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
    """Create the store, or migrate it: a migration holds maintenance.lock and runs only
    while no work runs (a job of the old version would write into the new schema)."""
    db = env.open_database(require_current=False)
    _made_private(env.database_url)  # a new store: 0600 from its first byte
    with contextlib.ExitStack() as held:
        held.callback(db.dispose)
        if current_revision(db) not in (None, HEAD_REVISION):
            held.callback(env.locks.maintenance().release)
            _no_work_running(env, db, "migrate")
        before, after = upgrade(db)
    log.info("database %s: %s -> %s", redact_url_password(env.database_url), before, after)
    return RevisionReport(env.database_url, before, after, HEAD_REVISION)


def database_revision(env: Environment) -> RevisionReport:
    path = sqlite_path(env.database_url)
    if path is not None and not path.exists():  # none yet, and reading makes none
        return RevisionReport(env.database_url, None, None, HEAD_REVISION)
    db = env.open_database(require_current=False)
    try:
        revision = current_revision(db)
    finally:
        db.dispose()
    ensure_not_newer(revision)
    return RevisionReport(env.database_url, revision, revision, HEAD_REVISION)


def _a_file_to_copy_to(url: str) -> None:
    """A SQLite --to (an absolute path, as its settings checked) names a file that keeps
    what is copied: no query (whose `?` would cut the file's name short), not a
    directory."""
    if not is_sqlite(url):
        return
    path = sqlite_path(url)
    if path is None or "?" in url:
        raise InvalidInput("--to must name a SQLite file (sqlite:////absolute/path.db)")
    if path.exists() and not path.is_file():
        raise InvalidInput(f"--to {path}: not a file")


def _made_private(url: str) -> None:
    """A new SQLite target is made 0600 (as a backup is) before SQLite creates it with the
    umask's mode; its journal files take the same."""
    path = sqlite_path(url)
    if path is not None and not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            write_private_file(path, b"", replace=False)


@dataclass
class CopyReport(Report):
    source: str
    target: str
    revision: str
    rows: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": redact_url_password(self.source),
            "target": redact_url_password(self.target),
            "revision": self.revision,
            "rows": self.rows,
        }


def copy_database(env: Environment, to_url: str) -> CopyReport:
    """Copy the whole store to the empty database at TO_URL (created or migrated to this
    version's schema first), under maintenance.lock and only while no work runs: how an
    installation moves from SQLite to PostgreSQL (then point database.url at it)."""
    from aiworker.config.database import Database as DatabaseSettings
    from aiworker.store.copy import copy_rows, occupied
    from aiworker.store.engine import Database

    try:
        DatabaseSettings(url=to_url)
    except ValidationError as exc:  # its words never repeat the URL (a password)
        why = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise InvalidInput(f"--to: {why}") from None
    if to_url == env.database_url:
        raise InvalidInput("--to names the database in use; name another one")
    _a_file_to_copy_to(to_url)
    maintenance = env.locks.maintenance()
    source, target = env.open_database(), None
    try:
        _no_work_running(env, source, "copy")
        full = occupied(to_url)  # before anything is written there
        if full:
            raise InvalidInput(f"--to is not empty ({'; '.join(full)}); name a new database")
        _made_private(to_url)
        target = Database(to_url)
        upgrade(target)
        rows = copy_rows(source, target)
    finally:
        if target is not None:
            target.dispose()
        source.dispose()
        maintenance.release()
    log.info("copied %s to %s", redact_url_password(env.database_url), redact_url_password(to_url))
    return CopyReport(env.database_url, to_url, HEAD_REVISION, rows)


def _no_work_running(env: Environment, db: Any, doing: str) -> None:
    """LockHeld while an attempt is open, or a job started has not recorded its own yet.
    An attempt whose job died on this host (its process gone: killed, a reboot) holds
    nothing: the first tick after recovers it, as any dead job's, so it must not stop the
    migration that tick needs (the old version's tick is gone with the old version)."""
    from aiworker.core.tasks.hosts import ours
    from aiworker.core.tasks.recovery import job_alive

    with db.read_connection() as connection:
        found = open_attempt_jobs(connection)
    dead = {a for a in found if ours(db, a[3]) and a[2] and not job_alive(a[2], a[1])}
    running = [a for a in found if a not in dead]
    working = env.locks.working()
    if running or working:
        other = {a: "" if ours(db, a[3]) else f" on controller {a[3]}" for a in running}
        named = [f"attempt {a[0]} of task {a[1]}{other[a]}" for a in running]
        what = ", ".join(working or named[:5])
        raise LockHeld(
            f"work is running ({what}): pause the scheduler, let the jobs finish, then {doing}"
        )
