"""`aiworker poll`: find labelled and assigned issues, verify who authorised them, record tasks.

Three kinds keep their own policies: a plan (the plan label), a feature (the
legacy parallel feature label) and a direct issue (assigned to the worker
identity). A second poll with nothing changed writes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.models import Issue
from aiworker.config.models import Config
from aiworker.core.context import Environment
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.intake.authorization import (
    Decision,
    PermissionReader,
    assignment_actor,
    decide,
    label_actor,
)
from aiworker.core.intake.recording import pause_task, record_discovered
from aiworker.core.intake.scope import fingerprint
from aiworker.core.report import Report
from aiworker.store.discovery import tasks_of
from aiworker.store.task_records import ensure_repository

log = logging.getLogger(__name__)


@dataclass
class Candidate:
    kind: str
    issue: Issue
    decision: Decision


@dataclass
class PollReport(Report):
    repositories: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    unauthorized: list[dict[str, Any]] = field(default_factory=list)
    paused: list[dict[str, Any]] = field(default_factory=list)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def to_json(self) -> dict[str, Any]:
        return {
            "repositories": self.repositories,
            "tasks": self.outcomes,
            "unauthorized": self.unauthorized,
            "paused": self.paused,
        }


def candidates(
    client: ForgejoClient,
    reader: PermissionReader,
    config: Config,
    owner: str,
    name: str,
    worker_login: str,
) -> list[Candidate]:
    """The open issues that ask for work, each with its authorisation decided now."""
    labels = config.labels
    found: dict[int, tuple[str, Issue]] = {}
    for issue in client.list_issues(owner, name, assignee=worker_login):
        found[issue.number] = ("issue", issue)
    for kind, label in (("feature", labels.feature), ("plan", labels.plan)):
        for issue in client.list_issues(owner, name, labels=[label]):
            found[issue.number] = (kind, issue)
    return [
        Candidate(
            kind, issue, authorize(client, reader, config, owner, name, kind, issue, worker_login)
        )
        for kind, issue in (found[number] for number in sorted(found))
    ]


def authorize(
    client: ForgejoClient,
    reader: PermissionReader,
    config: Config,
    owner: str,
    name: str,
    kind: str,
    issue: Issue,
    worker_login: str,
) -> Decision:
    """Decide now, from the issue's timeline, whether the work was authorised."""
    timeline = client.timeline(owner, name, issue.number)
    if kind == "issue":
        actor = assignment_actor(timeline, worker_login)
        return decide(reader, owner, name, issue, actor, f"assigned to {worker_login}")
    label = config.labels.plan if kind == "plan" else config.labels.feature
    return decide(reader, owner, name, issue, label_actor(timeline, label), f"labelled {label}")


def still_authorized(
    env: Environment, access: ForgeAccess, owner: str, name: str, kind: str, issue: Issue
) -> Decision:
    """Re-verify, from the issue's timeline now, that a task's work is still authorised."""
    return authorize(
        access.required("worker"),
        PermissionReader(access.optional("operator"), access.bots()),
        env.loaded.config,
        owner,
        name,
        kind,
        issue,
        access.logins["worker"],
    )


def poll(env: Environment, access: ForgeAccess) -> PollReport:
    config = env.loaded.config
    report = PollReport()
    worker = access.required("worker")
    worker_login = access.logins["worker"]
    bots = {
        access.logins[role]: client
        for role, client in access._clients.items()
        if role != "operator"
    }
    reader = PermissionReader(access.optional("operator"), bots)
    db = env.open_database()
    try:
        for repo_config in config.repositories:
            owner, name = repo_config.owner, repo_config.name
            found = candidates(worker, reader, config, owner, name, worker_login)
            report.repositories += 1
            with db.write() as session:
                repo = ensure_repository(session, repo_config.index, owner, name)
                known = tasks_of(session, repo.id)
                wanted = set()
                for candidate in found:
                    key = (candidate.kind, candidate.issue.number)
                    if not candidate.decision.authorized:
                        report.unauthorized.append(
                            {
                                "repository": f"{owner}/{name}",
                                "issue": candidate.issue.number,
                                "kind": candidate.kind,
                                "reason": candidate.decision.reason,
                            }
                        )
                        continue
                    wanted.add(key)
                    report.count(
                        record_discovered(
                            session,
                            repo.id,
                            candidate.kind,
                            candidate.issue.number,
                            candidate.issue.title,
                            fingerprint(candidate.issue),
                            known.get(key),
                            candidate.decision.actor,
                        )
                    )
                for key, task in known.items():
                    if (
                        key not in wanted
                        and task.kind != "milestone"
                        and pause_task(session, task, "authorization withdrawn or issue closed")
                    ):
                        report.paused.append(
                            {"repository": f"{owner}/{name}", "issue": key[1], "task": task.id}
                        )
    finally:
        db.dispose()
    log.info("polled %d repositories: %s", report.repositories, report.outcomes)
    return report
