"""`aiworker task list` and `aiworker task show`: one task's whole story from the store.

Nothing here calls the forge or a provider: what is shown is what was recorded
(state, every event, every attempt with its provider and outcome, budgets,
receipts, the publication) plus where the task's files are on disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from aiworker.core.context import Environment, task_artifacts, task_log
from aiworker.core.report import Report
from aiworker.core.tasks.states import TaskState
from aiworker.errors import InvalidInput
from aiworker.secrets import redact
from aiworker.store.attempts import attempts_of
from aiworker.store.budgets import budgets_of
from aiworker.store.models import Repository
from aiworker.store.publications import publications_of
from aiworker.store.receipts import receipts_of
from aiworker.store.task_records import (
    events_of,
    existing_task,
    list_tasks,
    recent_events,
)

LIST_LIMIT = 500
SECRET_MARGIN = 8192  # longer than any token the redactor masks
OUTPUT_TAIL_CHARS = 1500  # of an attempt's kept provider output, in `task show`


def _when(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass
class TaskListReport(Report):
    tasks: list[dict[str, Any]] = field(default_factory=list)
    next_after: int | None = None


@dataclass
class TaskShowReport(Report):
    id: int
    kind: str
    repository: str
    issue: int | None
    title: str
    state: str
    version: int
    parent: int | None
    scope_fingerprint: str | None
    base: str | None
    head: str | None
    claim: dict[str, Any] | None
    budgets: dict[str, dict[str, int]]
    history: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    receipts: list[dict[str, Any]]
    publications: list[dict[str, Any]]
    files: list[str]


def list_task_rows(
    env: Environment, state: str | None, limit: int = LIST_LIMIT, after: int = 0
) -> TaskListReport:
    if state is not None and state not in set(TaskState):
        raise InvalidInput(
            f"unknown state {state!r}; states: {', '.join(s.value for s in TaskState)}"
        )
    db = env.open_database()
    try:
        with db.read() as session:
            rows = list(list_tasks(session, state, limit, after))
            tasks = [
                {
                    "id": t.id,
                    "kind": t.kind,
                    "repository": f"{r.owner}/{r.name}",
                    "issue": t.issue_number,
                    "state": t.state,
                    "title": t.title,
                    "updated_at": _when(t.updated_at),
                }
                for t, r in rows
            ]
    finally:
        db.dispose()
    more = rows[-1][0].id if len(rows) == limit else None
    return TaskListReport(tasks, more)


def show_task(env: Environment, task_id: int) -> TaskShowReport:
    db = env.open_database()
    try:
        with db.read() as session:
            task = existing_task(session, task_id)
            repository = session.get(Repository, task.repository_id)
            assert repository is not None
            return TaskShowReport(
                id=task.id,
                kind=task.kind,
                repository=f"{repository.owner}/{repository.name}",
                issue=task.issue_number,
                title=task.title,
                state=task.state,
                version=task.version,
                parent=task.parent_id,
                scope_fingerprint=task.scope_fingerprint,
                base=task.base_commit,
                head=task.head_commit,
                claim=None
                if task.claim_slot is None
                else {
                    "slot": task.claim_slot,
                    "holder": task.claim_token,
                    "host": task.claim_host,
                    "claimed_at": _when(task.claimed_at),
                },
                budgets=_budgets(env, budgets_of(session, task.id)),
                history=[
                    {
                        "at": _when(e.created_at),
                        "kind": e.kind,
                        "from": e.from_state,
                        "to": e.to_state,
                        "actor": e.actor,
                        "data": e.data,
                    }
                    for e in events_of(session, task.id)
                ],
                attempts=[
                    {
                        "id": a.id,
                        "phase": a.phase,
                        "provider": a.provider,
                        "model": a.model,
                        "started_at": _when(a.started_at),
                        "finished_at": _when(a.finished_at),
                        "outcome": a.outcome or "open",
                        "reason": a.reason,
                        "refunded": a.refunded,
                        "workspace": a.workspace_path,
                        "prompt": a.prompt_path,
                        "result": a.result_path,
                        "log": a.log_path,
                        "output_tail": output_tail(a.log_path),
                    }
                    for a in attempts_of(session, task.id)
                ],
                receipts=[
                    {
                        "phase": r.phase,
                        "check": r.check_id,
                        "outcome": r.outcome,
                        "head": r.head_commit,
                        "base": r.base_commit,
                        "at": _when(r.created_at),
                    }
                    for r in receipts_of(session, task.id)
                ],
                publications=[
                    {
                        "state": p.state,
                        "branch": p.remote_branch,
                        "pr": p.pr_number,
                        "head": p.head_commit,
                    }
                    for p in publications_of(session, task.id)
                ],
                files=[str(p) for p in task_artifacts(env.state_dir, task.id)],
            )
    finally:
        db.dispose()


def output_tail(log_path: str | None, limit: int = OUTPUT_TAIL_CHARS) -> str:
    """The end of what the attempt's provider printed (kept masked), while it is kept."""
    if not log_path:
        return ""
    try:
        with open(log_path, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _budgets(env: Environment, used: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    limits = env.loaded.config.budgets
    return {phase: {**row, "limit": limits.limit(phase)} for phase, row in used.items()}


def recent(env: Environment, limit: int, before: int | None = None) -> dict[str, Any]:
    """The newest events of every task, newest first (secrets were never recorded)."""
    db = env.open_database()
    try:
        with db.read() as session:
            rows = recent_events(session, limit, before)
            events = [
                {
                    "id": e.id,
                    "at": _when(e.created_at),
                    "task": e.task_id,
                    "kind": e.kind,
                    "from": e.from_state,
                    "to": e.to_state,
                    "actor": e.actor,
                    "reason": (e.data or {}).get("reason"),
                }
                for e in rows
            ]
    finally:
        db.dispose()
    return {"events": events, "next_before": events[-1]["id"] if len(events) == limit else None}


def task_log_tail(env: Environment, task_id: int, limit: int) -> tuple[int, str]:
    """The size of TASK_ID's log and its last LIMIT characters, secrets masked; a task
    with no log yet has an empty one, a task that does not exist is not found."""
    # Read a margin more and mask before cutting: a secret across the cut is masked too.
    window = limit + SECRET_MARGIN
    try:
        with task_log(env, task_id).open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - window))
            return size, redact(handle.read(window).decode(errors="replace"))[-limit:]
    except FileNotFoundError:
        pass
    db = env.open_database()
    try:
        with db.read() as session:
            existing_task(session, task_id)
    finally:
        db.dispose()
    return 0, ""
