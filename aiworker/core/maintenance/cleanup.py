"""`aiworker cleanup`: after confirmed delivery, remove a task's workspaces, bundles and logs.

Results, receipts and merge evidence stay in the store; an inventory records
what was removed and what was kept. Only delivered (`done`) tasks are touched:
never an active claim, the shared git cache, or work awaiting publication.
Nothing outside the state directory is removed, links are never followed, and a
task whose lock is live is skipped. Removal is idempotent, so a run that
crashed is simply run again; a second run reports nothing changed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from aiworker.core.context import Environment
from aiworker.runtime.attempts import remove_attempt
from aiworker.store.cleanup import delivered_task_ids, record_cleanup


def _size(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum(Path(root, f).lstat().st_size for f in files)
    return total


def task_artifacts(state_dir: Path, task_id: int) -> list[Path]:
    workspaces = state_dir / "workspaces"
    found = [*workspaces.glob(f"task-{task_id}-*")] if workspaces.is_dir() else []
    found += [p for p in (state_dir / "logs" / f"task-{task_id}.log",) if p.exists()]
    return sorted(found)


def cleanup(env: Environment) -> dict[str, Any]:
    state = env.state_dir.resolve()
    db = env.open_database()
    removed: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    try:
        with db.read() as session:
            delivered = delivered_task_ids(session)
        for task_id in delivered:
            lock = env.locks.lock(f"task-{task_id}")
            if lock.is_locked():
                skipped.append({"task": task_id, "reason": "a step of this task is running"})
                continue
            for path in task_artifacts(env.state_dir, task_id):
                parent = path.parent.resolve()
                if parent != state and state not in parent.parents:
                    skipped.append(
                        {
                            "task": task_id,
                            "path": str(path),
                            "reason": "outside the state directory",
                        }
                    )
                    continue
                size = _size(path)
                if path.is_dir() and not path.is_symlink():
                    gone = remove_attempt(path).removed
                else:
                    path.unlink(missing_ok=True)
                    gone = not os.path.lexists(path)
                if gone:
                    with db.write() as session:
                        record_cleanup(
                            session,
                            task_id,
                            str(path),
                            "removed",
                            "delivered: workspace, bundle or log",
                            size,
                        )
                    removed.append({"task": task_id, "path": str(path), "bytes": size})
    finally:
        db.dispose()
    return {
        "removed": removed,
        "skipped": skipped,
        "changed": bool(removed),
        "kept": "results, receipts and merge evidence stay in the store",
    }
