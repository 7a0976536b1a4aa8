"""After a restore, before any new work: does the forge still agree with each task that
has not ended? A snapshot is older than the forge: a PR may have moved, merged or
closed, a review or status may be missing. A task the forge agrees with carries on;
one it does not, or that cannot be checked (the forge unreachable), is held: paused
with the reason until an operator resumes it (`aiworker task resume`)."""

from __future__ import annotations

import logging
from typing import Any

from aiworker.adapters.forgejo.client import ForgejoClient
from aiworker.core.context import Environment
from aiworker.core.evidence.ci_status import CI_CONTEXT, ours_passed
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.tasks.hold import hold_task
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import AiworkerError
from aiworker.runtime.git_failures import GitCacheError
from aiworker.runtime.gitcache import GitCache
from aiworker.store.engine import Database
from aiworker.store.restore import TaskToVerify, tasks_to_verify
from aiworker.store.tasks import task_state as current_state

log = logging.getLogger(__name__)


def verify_tasks(env: Environment, db: Database) -> list[dict[str, Any]]:
    with db.read() as session:
        todo = tasks_to_verify(session)
    if not todo:
        return []
    client: ForgejoClient | None = None
    logins: dict[str, str | None] = {}
    unreachable = ""
    unfilled: dict[int, str] = {}
    try:
        access = ForgeAccess(env.loaded)
        client = access.required("worker")
        logins = {role: access.logins.get(role) for role in ("reviewer", "worker")}
        logins["ci"] = access.logins.get(access.status_role())
        unfilled = _refill_git_cache(env, client, access.token("worker"))
    except AiworkerError as exc:
        client, unreachable = None, f"the forge could not be read: {exc.message}"
    verdicts = []
    for task in todo:
        if task.state == S.PAUSED:
            verdicts.append(_verdict(task, "stays paused", "it was paused before the backup"))
            continue
        why: str | None = unfilled.get(task.repository) or unreachable or None
        try:
            if client is not None and why is None:
                why = _disagreement(client, logins, task)
                if why is None and task.pr is None:  # a PR's head is on the forge
                    why = _head_lost(env, task)
        except AiworkerError as exc:
            why = f"the forge could not be read: {exc.message}"
        if why is None:
            verdicts.append(_verdict(task, "carries on", "the forge agrees with the record"))
            continue
        reason = f"held after a restore: {why}"
        if not _hold(db, task, reason):
            verdicts.append(_verdict(task, "not held", f"it moved meanwhile: {why}"))
            continue
        log.warning("task %d %s", task.id, reason)
        verdicts.append(_verdict(task, "held", reason))
    return verdicts


def _refill_git_cache(env: Environment, client: ForgejoClient, token: str | None) -> dict[int, str]:
    """Fetch every repository into the new git cache (the old host's is gone); returns
    why each one that could not be fetched was not."""
    cache = GitCache(env.state_dir)
    failed = {}
    for repo in env.loaded.config.repositories:
        try:
            cache.fetch(repo.index, client.repository(repo.owner, repo.name).clone_url, token)
        except (AiworkerError, GitCacheError) as exc:
            failed[repo.index] = f"repository {repo.owner}/{repo.name} could not be fetched: {exc}"
    return failed


def _head_lost(env: Environment, task: TaskToVerify) -> str | None:
    """A head the old host made and never pushed is gone with its git cache."""
    if task.head is None:
        return None
    try:
        GitCache(env.state_dir).resolve(task.repository, task.head)
    except GitCacheError:
        return f"its head {task.head} is on no branch of the forge (it was never pushed)"
    return None


def _hold(db: Database, task: TaskToVerify, reason: str) -> bool:
    """Hold TASK; a poll that changed it meanwhile (a new scope) is read and tried again."""
    state, version = task.state, task.version
    for _ in range(3):
        if hold_task(db, task.id, state, version, reason, actor="restore"):
            return True
        with db.read() as session:
            now = current_state(session, task.id)
        if now is None or now[0] in (S.PAUSED, S.DONE, S.FAILED, S.CANCELLED):
            return False
        state, version = now
    return False


def _verdict(task: TaskToVerify, outcome: str, reason: str) -> dict[str, Any]:
    return {"task": task.id, "state": task.state, "outcome": outcome, "reason": reason}


def _disagreement(
    client: ForgejoClient, logins: dict[str, str | None], task: TaskToVerify
) -> str | None:
    """Why the forge does not agree with TASK's record, or None when it does."""
    if task.pr is None:
        if task.issue is None:
            return None  # a milestone: its plan's issue is checked with the plan
        issue = client.issue(task.owner, task.name, task.issue)
        return None if issue.state == "open" else f"issue #{task.issue} is {issue.state}"
    pull = client.pull(task.owner, task.name, task.pr)
    if pull.merged:
        # An approved task's merge step finds it merged and records it.
        merged = f"PR #{task.pr} is merged on the forge, but the record says {task.state}"
        return None if task.state == S.APPROVED else merged
    if pull.state != "open":
        return f"PR #{task.pr} is {pull.state} on the forge"
    if pull.head.sha != task.head:
        return (
            f"PR #{task.pr}'s head is {pull.head.sha} on the forge; the record says "
            f"{task.head}: work after the backup is not in it"
        )
    return _missing_word(client, logins, task, pull.head.sha)


def _missing_word(
    client: ForgejoClient, logins: dict[str, str | None], task: TaskToVerify, head: str
) -> str | None:
    """What a task past CI or review relies on that the forge no longer shows."""
    missing = None
    if task.state in (S.AWAITING_REVIEW, S.APPROVED):
        ours = {logins.get("ci"), logins.get("worker")}
        statuses = client.combined_status(task.owner, task.name, head).statuses
        if not ours_passed(statuses, ours):
            missing = f"no successful '{CI_CONTEXT}' status on {head} on the forge"
    if missing is None and task.state == S.APPROVED:
        reviewer = logins.get("reviewer")
        if not any(
            r.state == "APPROVED"
            and r.commit_id == head
            and r.user is not None
            and r.user.login == reviewer
            for r in client.reviews(task.owner, task.name, task.pr or 0)
        ):
            missing = f"no approving review of {head} on the forge"
    return missing
