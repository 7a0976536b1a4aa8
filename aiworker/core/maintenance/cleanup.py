"""`aiworker cleanup` (and every scheduler tick): remove what finished tasks left on disk.

Workspaces, bundles and logs of a delivered (`done`) task are removed at once;
those of a `failed` or `cancelled` task after the retention period
(housekeeping.retention_days, default 7), so an operator can still look at what
went wrong. Results, receipts and merge evidence stay in the store; an
inventory records each removal. An active task, a task whose step holds its
lock, the shared git cache and anything outside the state directory are never
touched; links are never followed. A second run reports nothing changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiworker.core.context import Environment, task_artifacts, tasks_with_artifacts
from aiworker.core.report import Report
from aiworker.runtime.attempts import remove_attempt
from aiworker.store.engine import Database
from aiworker.store.tasks import states_of

FINISHED = ("done", "failed", "cancelled")


@dataclass
class CleanupReport(Report):
    removed: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    changed: bool = False
    kept: str = "results, receipts and merge evidence stay in the store"


def _size(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum(Path(root, f).lstat().st_size for f in files)
    return total


def cleanup(
    env: Environment, db: Database | None = None, now: datetime | None = None
) -> CleanupReport:
    report = CleanupReport()
    candidates = tasks_with_artifacts(env.state_dir)
    if not candidates:
        return report
    own = db is None
    db = db or env.open_database()
    try:
        with db.read_connection() as connection:
            states = states_of(connection, sorted(candidates))
        _remove(env, db, states, now or datetime.now(UTC), report)
    finally:
        if own:
            db.dispose()
    report.changed = bool(report.removed)
    return report


def _remove(
    env: Environment,
    db: Database,
    states: dict[int, tuple[str, datetime]],
    now: datetime,
    report: CleanupReport,
) -> None:
    retention = timedelta(days=env.loaded.config.housekeeping.retention_days)
    state_root = env.state_dir.resolve()
    for task_id, (state, updated_at) in sorted(states.items()):
        if state not in FINISHED:
            continue
        if state != "done" and now - updated_at < retention:
            report.skipped.append(
                {"task": task_id, "reason": f"{state}: kept for {retention.days} days"}
            )
            continue
        if env.locks.lock(f"task-{task_id}").is_locked():
            report.skipped.append({"task": task_id, "reason": "a step of this task is running"})
            continue
        why = "delivered" if state == "done" else f"{state} {retention.days}+ days ago"
        for path in task_artifacts(env.state_dir, task_id):
            parent = path.parent.resolve()
            if parent != state_root and state_root not in parent.parents:
                report.skipped.append(
                    {"task": task_id, "path": str(path), "reason": "outside the state directory"}
                )
                continue
            size = _size(path)
            if path.is_dir() and not path.is_symlink():
                gone = remove_attempt(path).removed
            else:
                path.unlink(missing_ok=True)
                gone = not os.path.lexists(path)
            if gone:
                from aiworker.store.cleanup import record_cleanup

                with db.write() as session:
                    record_cleanup(
                        session,
                        task_id,
                        str(path),
                        "removed",
                        f"{why}: workspace, attempt files or log",
                        size,
                    )
                report.removed.append({"task": task_id, "path": str(path), "bytes": size})
