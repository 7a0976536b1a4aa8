"""`aiworker task cancel`: an operator stops one task (retry is in retry.py).

Cancel moves the task to cancelled first (so the job that runs it finds its own last
move refused), then stops that job: SIGTERM to its process tree, which its phase guard
turns into a closed attempt, and SIGKILL after a grace period to whatever is left,
including the provider's processes found by their attempt tag. Open attempts are closed
as cancelled, workspaces removed with an inventory, and an open PR is left open with a
comment (one that merged before the cancel took effect is recorded as merged). A plan's
unfinished milestones are cancelled with it, their jobs stopped alike.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aiworker.core.context import Environment, task_artifacts
from aiworker.core.report import Report
from aiworker.core.tasks.budgets import RELEASE
from aiworker.core.tasks.lifecycle import Refusal, try_advance
from aiworker.core.tasks.recovery import job_alive, launched_pid
from aiworker.core.tasks.states import TERMINAL, TaskState
from aiworker.errors import AiworkerError, Conflict, disk_full
from aiworker.runtime.attempts import remove_attempt
from aiworker.runtime.processes import process_alive
from aiworker.runtime.reaper import process_tree, signal_all, tagged_processes
from aiworker.store.attempts import finish_attempt, open_attempts
from aiworker.store.cleanup import record_cleanup
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task
from aiworker.store.publications import advance_publication, close_publication, publications_of
from aiworker.store.task_records import children_of, existing_task
from aiworker.store.tasks import append_event
from aiworker.store.worker_job_records import end_awaited_by

if TYPE_CHECKING:
    from aiworker.adapters.forgejo.models import PullRequest

STOP_GRACE_S = 10.0
log = logging.getLogger(__name__)


@dataclass
class CancelReport(Report):
    task: int
    state: str
    was: str
    stopped: list[int] = field(default_factory=list)
    attempts_closed: list[int] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    pr_comment: int | None = None
    pr_merged: int | None = None  # the PR had merged before the cancel took effect


def _task(db: Database, task_id: int) -> Task:
    with db.read() as session:
        return existing_task(session, task_id)


def cancel_task(env: Environment, task_id: int) -> CancelReport:
    db = env.open_database()
    try:
        try:
            task = _cancel_record(db, task_id)
        except AiworkerError as exc:
            if disk_full(exc):
                _stop_unrecorded(env, db, task_id, exc)
            raise
        report = CancelReport(task.id, TaskState.CANCELLED, task.state)
        # A plan's unfinished milestones go with it: nothing of a cancelled plan runs on.
        for one in (task, *_milestones_cancelled(db, task)):
            report.stopped += stop_jobs(env, db, one)
            with db.write() as session:
                closed = [
                    attempt.id
                    for attempt in open_attempts(session, one.id)
                    if finish_attempt(
                        session, attempt.id, "cancelled", reason="cancelled by an operator"
                    )
                ]
            report.attempts_closed += closed
            for attempt_id in closed:  # no runner runs their checks for nobody
                end_awaited_by(db, attempt_id, {"error": f"task {one.id} was cancelled"})
            report.removed += _remove_workspaces(env, db, one.id)
        _settle_pull(env, db, task, report)
        return report
    finally:
        db.dispose()


def _stop_unrecorded(env: Environment, db: Database, task_id: int, exc: AiworkerError) -> None:
    """The disk is too full to record the cancel: the job is stopped all the same, a plan's
    milestones' too (a job filling the disk must not be beyond the operator's reach), and
    EXC says so."""
    try:
        task = _task(db, task_id)
        stopped = {one.id: stop_jobs(env, db, one, record=False) for one in _unfinished(db, task)}
    except AiworkerError as unreadable:
        exc.message += f"; task {task_id}'s job could not be found to stop it: {unreadable}"
        return
    said = [
        f"task {one}'s job was stopped (pids {', '.join(map(str, pids))})"
        for one, pids in stopped.items()
        if pids
    ]
    if said:
        exc.message += (
            f"; {'; '.join(said)}, but its cancel is not recorded: run `aiworker task cancel "
            f"{task_id}` again once there is space"
        )


def _unfinished(db: Database, task: Task) -> list[Task]:
    """TASK, and a plan's milestones that did not finish."""
    if task.kind != "plan":
        return [task]
    with db.read() as session:
        return [task, *(c for c in children_of(session, task.id) if c.state not in TERMINAL)]


def _milestones_cancelled(db: Database, task: Task) -> list[Task]:
    """PLAN's milestones that were not finished, each cancelled now (as they were)."""
    cancelled = []
    for child in (one.id for one in _unfinished(db, task)[1:]):
        with contextlib.suppress(Conflict):  # finished meanwhile: nothing to cancel
            cancelled.append(_cancel_record(db, child))
    return cancelled


def _cancel_record(db: Database, task_id: int) -> Task:
    """Move the task to cancelled, re-reading when a job moved it meanwhile."""
    for _ in range(5):
        task = _task(db, task_id)
        if task.state in TERMINAL:
            raise Conflict(f"task {task_id} is {task.state}; there is nothing to cancel")
        with db.write() as session:
            moved = try_advance(
                session,
                task.id,
                task.state,
                task.version,
                TaskState.CANCELLED,
                "cancelled by an operator",
                actor="operator",
                kind="task.cancelled",
                **RELEASE,
            )
        if not isinstance(moved, Refusal):
            return task
    raise Conflict(f"task {task_id} kept changing; try the cancel again")


def stop_jobs(
    env: Environment,
    db: Database,
    task: Task,
    why: str = "cancelled by an operator",
    *,
    record: bool = True,
) -> list[int]:
    """Stop every process working on TASK, because WHY; return the pids that were running
    (RECORD: in the task's history too)."""
    # The job's own records name it: the pid in its claim and in its open attempts (never a
    # lock's holder, which may be a tick that holds every free slot for a moment).
    holders = {launched_pid(task.claim_token)}
    with db.read() as session:
        attempts = [(a.id, a.phase, a.pid) for a in open_attempts(session, task.id)]
    holders.update(pid for _, _, pid in attempts)
    tags = [
        f"AIWORKER_ATTEMPT_ID={env.attempt_tag(phase, aid)}".encode() for aid, phase, _ in attempts
    ]
    tree: set[int] = set()
    for pid in holders:
        if pid != os.getpid() and job_alive(pid, task.id):
            assert pid is not None
            tree |= process_tree(pid)
    for tag in tags:
        tree.update(tagged_processes(tag))
    tree.discard(os.getpid())
    signal_all(tree, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while any(process_alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(20):
        left = {p for p in tree if process_alive(p)}
        for tag in tags:
            left.update(tagged_processes(tag))
        if not left:
            break
        signal_all(left, signal.SIGKILL)
        time.sleep(0.05)
    if tree and record:  # none: nothing ran, and nothing was stopped
        with db.write() as session:
            data = {"pids": sorted(tree), "reason": why}
            append_event(session, "task.jobs_stopped", task_id=task.id, data=data)
    return sorted(tree)


def _remove_workspaces(env: Environment, db: Database, task_id: int) -> list[str]:
    removed = []
    for path in task_artifacts(env.state_dir, task_id):
        if path.suffix == ".log" or path.parent.name == "attempts":
            continue  # the log and the attempts' files stay for the retention period
        gone = remove_attempt(path).removed if path.is_dir() else _unlink(path)
        if gone:
            with db.write() as session:
                record_cleanup(session, task_id, str(path), "removed", "cancelled", None)
            removed.append(str(path))
    return removed


def _unlink(path: Path) -> bool:
    path.unlink(missing_ok=True)
    return not path.exists()


def _settle_pull(env: Environment, db: Database, task: Task, report: CancelReport) -> None:
    """The task's pull request as the forge has it now (a publish or merge the cancel
    stopped may have reached the forge first, unrecorded): one that merged is recorded
    as merged, one still open gets the comment (its number recorded when the publish
    that opened it, stopped after its push, could not record it)."""
    from aiworker.core.forge_access import ForgeAccess

    with db.read() as session:
        publications = publications_of(session, task.id)
        repo = session.get(Repository, task.repository_id)
    recorded = [p.pr_number for p in publications if p.pr_number]
    pushed = [p for p in publications if p.state == "pushed" and not p.pr_number]
    if not (recorded or pushed):
        return  # never published, or stopped before its push: no PR can be open
    assert repo is not None
    try:
        # A courtesy the cancel can do without: a stalled forge costs one timeout, not
        # the retries' minutes.
        worker = ForgeAccess(env.loaded, attempts=1).required("worker")
        if recorded:
            pull: PullRequest | None = worker.pull(repo.owner, repo.name, recorded[-1])
        else:  # only the open ones: aiworker merges no PR it did not record
            marker = pushed[-1].ownership_marker
            found = worker.pulls(repo.owner, repo.name, state="open")
            pull = next((f for f in found if marker in f.body), None)
        if pull is None or (pull.state != "open" and not pull.merged):
            return
        if pull.merged:
            _merged_before(db, task, pull)
            report.pr_merged = pull.number
            return
        if not recorded:
            with db.write() as session:
                advance_publication(session, pushed[-1].id, "opened", pr_number=pull.number)
        report.pr_comment = worker.create_comment(
            repo.owner,
            repo.name,
            pull.number,
            "An operator cancelled this task in aiworker: it will not update, review or "
            "merge this pull request. It is left open for a person to decide.",
        ).id
    except AiworkerError as exc:
        try:
            with db.write() as session:
                data = {"reason": exc.message}
                append_event(session, "pr.comment_failed", task_id=task.id, data=data)
        except AiworkerError:  # the cancel itself is recorded; this note is not needed
            log.warning("task %d: the PR was not settled: %s", task.id, exc.message)


def _merged_before(db: Database, task: Task, pull: PullRequest) -> None:
    """PULL merged before the cancel took effect (its merge request was on its way): the
    publication is recorded as merged, and the task's history says so."""
    data = {"pr": pull.number, "head": pull.head.sha, "merge_commit": pull.merge_commit_sha}
    with db.write() as session:
        close_publication(session, task.id, "merged", pull.head.sha)
        append_event(session, "pr.merged_before_cancel", task_id=task.id, data=data)
