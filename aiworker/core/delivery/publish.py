"""`aiworker publish --task ID`: push the branch and open or update the PR, exactly once.

Right before publishing it re-checks authorisation, the scope fingerprint, the
pinned base (a moved base is merged into the work and checked again:
delivery/refresh.py) and the receipts. The intent is saved before any request and the
PR body carries an ownership marker (task and intent ids), so after a lost
response or a crash the next run finds the PR it made instead of opening
another. The pushed branch is read back and must equal the receipt's head.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import NoReturn

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.errors import ForgeNotFound
from aiworker.adapters.forgejo.models import Issue, PullRequest
from aiworker.core.delivery.refresh import refresh_base
from aiworker.core.delivery.scope_check import answer_moved_scope, paused_if_withdrawn
from aiworker.core.evidence.authorisation import checked_at_head
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.intake.scope import fingerprint
from aiworker.core.intake.standing import still_authorized
from aiworker.core.phases.at_head import closed_by_person
from aiworker.core.phases.job import Job
from aiworker.core.phases.merged import merged
from aiworker.core.phases.outcome import Outcome
from aiworker.core.report import Report
from aiworker.core.tasks.milestones import accepted_milestones, checks_of
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import Conflict, NeedsPerson
from aiworker.runtime.failpoints import failpoint
from aiworker.runtime.gitcache import GitCache
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task
from aiworker.store.publications import (
    advance_publication,
    current_publication,
    publications_of,
    published_heads,
    save_intent,
)
from aiworker.store.tasks import append_event

MARKER = "<!-- aiworker:task={task} intent={intent} -->"
OTHER_TASK = re.compile(r"<!-- aiworker:task=(\d+) intent=")
PUSHING = "publish.pushing"


@dataclass
class PublishReport(Report):
    task: int
    pr: int | None
    branch: str
    head: str
    created: bool
    # repairing: a changed scope or a moved base sent the work to a repair episode
    # (awaiting_plan_approval: a plan's issue changed after approval); nothing was published.
    state: str = S.AWAITING_CI


def owned_by(pull: PullRequest, task_id: int) -> bool:
    return f"<!-- aiworker:task={task_id} " in pull.body


def refuse_publication(db: Database, task: Task, reason: str) -> NoReturn:
    """Publication does not go ahead: the reason is recorded, and the step fails with it."""
    with db.write() as session:
        append_event(session, "publish.refused", task_id=task.id, data={"reason": reason})
    raise Conflict(f"task {task.id} cannot be published: {reason}")


def _preconditions(
    job: Job, access: ForgeAccess, worker: ForgejoClient, report: PublishReport
) -> tuple[Issue, str] | Outcome:
    """The issue and default branch to publish against, or how the step ends instead: a
    repair episode for a changed scope or a moved base, or awaiting a new approval for a
    plan whose issue changed."""
    env, db, task, repo = job.env, job.db, job.task, job.repo
    issue = worker.issue(repo.owner, repo.name, task.issue_number or 0)
    decision = still_authorized(env, access, repo.owner, repo.name, task, issue)
    stopped = paused_if_withdrawn(decision, report) or answer_moved_scope(
        job, worker, issue, report
    )
    if stopped is not None:
        return stopped
    scope = fingerprint(issue, env.loaded.config.labels.approved)
    if scope != task.scope_fingerprint:
        refuse_publication(db, task, "the issue's requirements changed since the work was scoped")
    if task.kind == "plan" and (task.spec or {}).get("approved", {}).get("fingerprint") != scope:
        refuse_publication(db, task, "the plan's scope changed after it was approved")
    forge_repo = worker.repository(repo.owner, repo.name)
    base_now = worker.branch(repo.owner, repo.name, forge_repo.default_branch).commit.id
    if base_now != task.base_commit:
        # The receipts are for the old base: bring the work forward and check it again.
        refreshed = refresh_base(
            job,
            issue,
            worker,
            access.token("worker"),
            base_now,
            forge_repo.default_branch,
            report,
        )
        if isinstance(refreshed, Outcome):
            return refreshed
        task.head_commit, task.base_commit = refreshed.head, refreshed.base
        task.version = refreshed.version
        report.head = refreshed.head
    assert task.head_commit is not None
    assert task.base_commit is not None
    allowed, reason = checked_at_head(db, task, checks_of(db, task, issue.body))
    if not allowed:
        refuse_publication(db, task, reason)
    return issue, forge_repo.default_branch


def _no_commit_of_a_person(
    db: Database, cache: GitCache, job: Job, worker: ForgejoClient, branch: str
) -> None:
    """NeedsPerson when the task's branch on the forge is at a commit this task neither
    pushed nor builds its new head on: a person pushed it, and pushing would discard it."""
    task, repo = job.task, job.repo
    assert task.head_commit is not None
    try:
        there = worker.branch(repo.owner, repo.name, branch).commit.id
    except ForgeNotFound:
        return
    with db.read() as session:
        ours = published_heads(session, task.id)
    if there in ours or cache.contains(repo.index, there, task.head_commit):
        return
    raise NeedsPerson(
        f"{branch} on the forge is at {there[:12]}, which this task did not push, and "
        f"publishing would discard it (move the branch back, or cancel task {task.id})"
    )


def _no_other_task_s_pull(job: Job, worker: ForgejoClient, login: str) -> None:
    """NeedsPerson when a pull request aiworker opened for this task's issue, and not for
    one of this task's publications, is open: a second one would compete with it (another
    kind of task on the issue, or a database restored from before it or started over,
    where task ids repeat)."""
    task, repo = job.task, job.repo
    with job.db.read() as session:
        ours = [p.ownership_marker for p in publications_of(session, task.id)]
    resolves = f"Resolves #{task.issue_number}."
    for pull in worker.pulls(repo.owner, repo.name, state="open"):
        marked = OTHER_TASK.search(pull.body)
        if pull.user.login != login or marked is None or not pull.body.startswith(resolves):
            continue
        if any(marker in pull.body for marker in ours):
            continue
        with job.db.read() as session:
            other = session.get(Task, int(marked.group(1)))
        if other is not None and other.id != task.id and other.issue_number == task.issue_number:
            whose = f"task {other.id}, which is {other.state}"
        else:
            whose = "a task this database does not hold (restored from before it, or started over)"
        raise NeedsPerson(
            f"PR #{pull.number} is open for issue #{task.issue_number}, opened by aiworker for "
            f"{whose}: close PR #{pull.number} to publish this work instead, or cancel task "
            f"{task.id}"
        )


def _by_a_person(job: Job, worker: ForgejoClient, pr: int | None) -> Outcome | None:
    """The task's pull request PR as a person left it: one they closed is neither
    refreshed, pushed to nor replaced (NeedsPerson); one they merged is delivered."""
    if pr is None:
        return None
    pull = worker.pull(job.repo.owner, job.repo.name, pr)
    closed_by_person(job.task.id, pull)
    return merged(job, pull, worker, ours=False) if pull.merged else None


def publish(job: Job) -> Outcome:
    env, db, task, repo = job.env, job.db, job.task, job.repo
    assert task.head_commit is not None
    job.start(None, {"head": task.head_commit})
    access = ForgeAccess(env.loaded)
    worker = access.required("worker")
    branch = f"aiworker/task-{task.id}"
    report = PublishReport(task.id, None, branch, task.head_commit, False)
    job.report = report
    with db.read() as session:
        known = current_publication(session, task.id)
    pr = known.pr_number if known is not None else None
    delivered = _by_a_person(job, worker, pr)
    if delivered is not None:
        return delivered
    ready = _preconditions(job, access, worker, report)
    if isinstance(ready, Outcome):
        return ready.ended("succeeded", f"not published: {ready.reason}")
    issue, default_branch = ready
    with db.write() as session:
        publication = current_publication(session, task.id)
        if publication is None:
            intent = secrets.token_hex(8)
            publication = save_intent(
                session,
                task.id,
                intent,
                MARKER.format(task=task.id, intent=intent),
                branch,
                task.head_commit,
            )
        publication_id, marker = publication.id, publication.ownership_marker
    if pr is None:  # a first publication: no other task's pull request for the issue
        _no_other_task_s_pull(job, worker, access.logins["worker"])
    cache = GitCache(env.state_dir)
    _no_commit_of_a_person(db, cache, job, worker, branch)
    delivered = _by_a_person(job, worker, pr)  # again: the preconditions may take minutes
    if delivered is not None:
        return delivered
    with db.write() as session:  # a head this task pushes is known as its own before it is
        data = {"head": task.head_commit, "branch": branch}
        append_event(session, PUSHING, task_id=task.id, actor="publish", data=data)
    clone_url = worker.repository(repo.owner, repo.name).clone_url
    cache.push(repo.index, task.head_commit, clone_url, access.token("worker"), branch)
    pushed = worker.branch(repo.owner, repo.name, branch).commit.id
    if pushed != task.head_commit:
        refuse_publication(
            db, task, f"the pushed branch reads back {pushed}, not {task.head_commit}"
        )
    with db.write() as session:
        advance_publication(session, publication_id, "pushed")
    details = accepted_milestones(db, task)
    pull, created = _open_or_update(
        worker,
        repo,
        task,
        issue,
        branch,
        default_branch,
        marker + ("\n\n" + details if details else ""),
    )
    failpoint("publish.after_request")
    report.pr, report.created = pull.number, created
    landing = Outcome(
        report,
        S.AWAITING_CI,
        f"published as PR #{pull.number}",
        kind="task.published",
        data={"pr": pull.number, "head": task.head_commit, "created": created},
        scoped=True,
        # The PR is recorded with the move: a run that dies in between finds it again.
        writes=lambda session: advance_publication(
            session, publication_id, "opened", pull.number, task.head_commit
        ),
    )
    return landing.ended("succeeded", f"PR #{pull.number} at {task.head_commit}")


def _open_or_update(
    worker: ForgejoClient,
    repo: Repository,
    task: Task,
    issue: Issue,
    branch: str,
    base: str,
    marker: str,
) -> tuple[PullRequest, bool]:
    """The task's PR, found by its marker, or a new one; never a second. A PR found again
    after a repair or a base refresh gets its body updated to name the new head."""
    body = (
        f"Resolves #{issue.number}.\n\nImplemented by aiworker; every required check "
        f"passed at {task.head_commit} on base {task.base_commit}.\n\n{marker}\n"
    )
    for found in worker.pulls(repo.owner, repo.name, state="all"):
        if owned_by(found, task.id) and found.state == "open":
            if found.body.strip() == body.strip():
                return found, False
            return worker.update_pull(repo.owner, repo.name, found.number, body=body), False
    failpoint("publish.before_request")
    pull = worker.create_pull(
        repo.owner, repo.name, head=branch, base=base, title=issue.title, body=body
    )
    return pull, True
