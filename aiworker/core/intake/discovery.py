"""`aiworker poll`: find labelled and assigned issues, verify who authorised them, record tasks.

Three kinds keep their own policies: a plan (the plan label), a feature (the
legacy parallel feature label) and a direct issue (assigned to the worker
identity). A second poll with nothing changed writes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.errors import ForgeError
from aiworker.adapters.forgejo.models import Issue
from aiworker.config.models import Config
from aiworker.config.models import Repository as RepositoryConfig
from aiworker.core.context import Environment
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.intake.authorization import Covered, Decision, PermissionReader, authorize
from aiworker.core.intake.identity import forge_id_to_record
from aiworker.core.intake.recording import pause_task, record_discovered
from aiworker.core.intake.scope import fingerprint
from aiworker.core.intake.standing import Standing, judge_standing
from aiworker.core.report import Report
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import InvalidInput
from aiworker.store.discovery import coverage_of, tasks_of
from aiworker.store.engine import Database, Session
from aiworker.store.publications import open_pulls
from aiworker.store.task_records import (
    PollCursor,
    ensure_repository,
    poll_cursor,
    record_poll,
)

log = logging.getLogger(__name__)
# Between full polls, a poll lists only the issues updated since the last one (since=,
# one request per repository) and judges the other tasks by their authoriser's permission
# now, which changes no issue. A full poll re-reads every candidate and its timeline at
# least this often; claim, publish and merge re-verify authorisation themselves.
FULL_POLL_EVERY = timedelta(hours=1)
# Why a task whose issue was read pauses when its authorisation did not fail.
NOT_ASKED = "the issue no longer asks for this work (closed, or its label or assignment removed)"
# Where a repository's first full poll found nothing, the cursor starts this far
# before that poll: this host's clock may run ahead of the forge's.
CLOCK_MARGIN = timedelta(minutes=1)
# A task in these has a pull request its steps still check, review or repair (an approved
# one is never paused: its merge step records the merge, whoever made it).
DELIVERING = (S.IMPLEMENTED, S.AWAITING_CI, S.AWAITING_REVIEW, S.REPAIRING)


@dataclass
class Candidate:
    kind: str
    issue: Issue
    decision: Decision


@dataclass
class PollReport(Report):
    repositories: int = 0
    tasks: dict[str, int] = field(default_factory=dict)  # how many issues ended how
    unauthorized: list[dict[str, Any]] = field(default_factory=list)
    paused: list[dict[str, Any]] = field(default_factory=list)
    polls: dict[str, int] = field(default_factory=dict)  # full | incremental

    def count(self, outcome: str, bucket: dict[str, int] | None = None) -> None:
        counts = self.tasks if bucket is None else bucket
        counts[outcome] = counts.get(outcome, 0) + 1


def candidates(
    client: ForgejoClient,
    reader: PermissionReader,
    config: Config,
    owner: str,
    name: str,
    worker_login: str,
    covered: dict[int, Covered],
) -> list[Candidate]:
    """The open issues that ask for work, each with its authorisation decided now (and
    for a known task, whether it covers the issue as it reads: COVERED)."""
    labels = config.labels
    found: dict[int, tuple[str, Issue]] = {}
    for issue in client.list_issues(owner, name, assignee=worker_login):
        found[issue.number] = ("issue", issue)
    for kind, label in (("feature", labels.feature), ("plan", labels.plan)):
        for issue in client.list_issues(owner, name, labels=[label]):
            found[issue.number] = (kind, issue)
    return [
        Candidate(
            kind,
            issue,
            authorize(
                client,
                reader,
                config,
                owner,
                name,
                kind,
                issue,
                worker_login,
                covered.get(issue.number),
            ),
        )
        for kind, issue in (found[number] for number in sorted(found))
    ]


def changed_candidates(
    client: ForgejoClient,
    reader: PermissionReader,
    config: Config,
    owner: str,
    name: str,
    worker_login: str,
    cursor: PollCursor,
    covered: dict[int, Covered],
) -> tuple[list[Candidate], list[Issue]]:
    """An incremental poll: every issue updated since the cursor, open or closed, in one
    listing; those that ask for work get their authorisation decided now, from their
    timelines. Those updated in the cursor's very second are judged again too: a label
    removed and added again by someone else within that second changes nothing the listing
    shows (Forgejo's timestamps are whole seconds). Returns them and all the changed issues
    (a changed issue that no longer asks for work is withdrawn)."""
    changed = client.list_issues(owner, name, state="all", since=cursor.since)
    found = []
    for issue in changed:
        kind = kind_of(issue, config, worker_login)
        if kind is not None:
            known = covered.get(issue.number)
            decision = authorize(
                client, reader, config, owner, name, kind, issue, worker_login, known
            )
            found.append(Candidate(kind, issue, decision))
    return found, changed


def kind_of(issue: Issue, config: Config, worker_login: str) -> str | None:
    """The kind of work an open issue asks for (the plan label wins, as in a full poll)."""
    if issue.state != "open":
        return None
    labels = set(issue.label_names)
    if config.labels.plan in labels:
        return "plan"
    if config.labels.feature in labels:
        return "feature"
    if any(user.login == worker_login for user in issue.assignees):
        return "issue"
    return None


def poll(env: Environment, access: ForgeAccess, *, full: bool = False) -> PollReport:
    config = env.loaded.config
    report = PollReport()
    worker = access.required("worker")
    worker_login = access.logins["worker"]
    # One permission read per (repository, login) in a poll, whatever asks for it.
    reader = PermissionReader(access.optional("operator"), access.bots())
    db = env.open_database()
    refused: list[InvalidInput] = []  # repositories not polled: the others are
    try:
        for repo_config in config.repositories:
            owner, name = repo_config.owner, repo_config.name
            try:
                forge_id = forge_id_to_record(db, worker, repo_config.index, owner, name)
            except InvalidInput as exc:
                refused.append(exc)
                continue
            with db.read() as session:
                cursor = poll_cursor(session, repo_config.index)
                covered = {
                    key: Covered(*known)
                    for key, known in coverage_of(session, repo_config.index).items()
                }
            started = datetime.now(UTC)
            complete = full or cursor is None or started - cursor.full_at >= FULL_POLL_EVERY
            if complete:
                found = candidates(worker, reader, config, owner, name, worker_login, covered)
                listed = [c.issue for c in found]
            else:
                assert cursor is not None
                found, listed = changed_candidates(
                    worker, reader, config, owner, name, worker_login, cursor, covered
                )
            report.repositories += 1
            report.count("full" if complete else "incremental", bucket=report.polls)
            looked_at = None if complete else {issue.number for issue in listed}
            standing = judge_standing(db, reader, repo_config.index, owner, name, looked_at)
            merged = _merged_by_a_person(db, worker, repo_config, found, looked_at)
            with db.write() as session:
                repo = ensure_repository(session, repo_config.index, owner, name, forge_id)
                where = f"{owner}/{name}"
                _record(session, config, report, repo.id, where, found, standing, merged)
                record_poll(
                    session,
                    repo,
                    [(issue.number, issue.updated_at) for issue in listed],
                    started if complete else None,
                    started - CLOCK_MARGIN if complete else None,
                )
    finally:
        db.dispose()
    log.info("polled %d repositories: %s", report.repositories, report.tasks)
    if refused:
        raise refused[0]
    return report


def _merged_by_a_person(
    db: Database,
    client: ForgejoClient,
    repo: RepositoryConfig,
    found: list[Candidate],
    looked_at: set[int] | None,
) -> set[int]:
    """Tasks whose issue no longer asks for work because a person merged their pull
    request on the forge (Forgejo closes the issue it resolves): left to their next step,
    which records the merge and ends them done, instead of paused. Only a task this poll
    would pause is asked about; one whose pull request cannot be read is paused as before."""
    asking = {candidate.issue.number for candidate in found}
    with db.read() as session:
        pulls = open_pulls(session, repo.index, DELIVERING)
    merged = set()
    for task, (issue, pr) in pulls.items():
        if issue in asking or (looked_at is not None and issue not in looked_at):
            continue
        try:
            if client.pull(repo.owner, repo.name, pr).merged:
                merged.add(task)
        except ForgeError as exc:
            log.warning("task %d: PR #%d could not be read: %s", task, pr, exc.message)
    return merged


def _record(
    session: Session,
    config: Config,
    report: PollReport,
    repository_id: int,
    where: str,
    found: list[Candidate],
    standing: Standing,
    merged: set[int],
) -> None:
    known = tasks_of(session, repository_id)
    wanted, refused = set(), {}
    for candidate in found:
        key = (candidate.kind, candidate.issue.number)
        if not candidate.decision.authorized:
            refused[key] = candidate.decision.reason
            report.unauthorized.append(
                {
                    "repository": where,
                    "issue": candidate.issue.number,
                    "kind": candidate.kind,
                    "reason": candidate.decision.reason,
                }
            )
            continue
        wanted.add(key)
        task = known.get(key)
        report.count(
            record_discovered(
                session,
                repository_id,
                candidate.kind,
                candidate.issue.number,
                candidate.issue.title,
                fingerprint(candidate.issue, config.labels.approved),
                task,
                candidate.decision.actor,
                standing.authorizers.get(task.id) if task else None,
                candidate.decision.item,
                candidate.decision.scope,
            )
        )
    for key, task in known.items():
        if standing.looked_at is None or key[1] in standing.looked_at:
            if key in wanted or task.kind == "milestone":
                continue
            reason = refused.get(key, NOT_ASKED)
        elif task.id in standing.withdrawn:
            reason = standing.withdrawn[task.id]
        else:
            continue
        if task.id not in merged and pause_task(session, task, reason):
            report.paused.append(
                {"repository": where, "issue": key[1], "task": task.id, "reason": reason}
            )
