"""Who applied the label or the assignment, and may they? Verified on every poll.

Forgejo answers permission queries about other users only to repository
admins, so an optional operator identity (an admin, used for nothing else)
reads them. Without it, only what the bot identities may read is known: their
own permission, and the repository owner.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.errors import ForgeForbidden, ForgeNotFound
from aiworker.adapters.forgejo.models import Issue, TimelineComment
from aiworker.config.models import Config

WRITERS = ("write", "admin", "owner")


@dataclass(frozen=True)
class Decision:
    authorized: bool
    actor: str | None
    permission: str | None
    reason: str


class PermissionReader:
    def __init__(self, operator: ForgejoClient | None, bots: dict[str, ForgejoClient]) -> None:
        self.operator = operator
        self.bots = bots
        self._cache: dict[tuple[str, str, str], str | None] = {}

    def permission(self, owner: str, repo: str, login: str) -> str | None:
        key = (owner, repo, login)
        if key not in self._cache:
            self._cache[key] = self._read(owner, repo, login)
        return self._cache[key]

    def _read(self, owner: str, repo: str, login: str) -> str | None:
        if login == owner:
            return "owner"
        reader = self.operator or self.bots.get(login)
        if reader is None:
            return None
        try:
            return reader.collaborator_permission(owner, repo, login).permission
        except (ForgeForbidden, ForgeNotFound):
            return None


def label_actor(timeline: list[TimelineComment], label: str) -> str | None:
    """Who last added LABEL (Forgejo marks an addition with body "1")."""
    for event in reversed(timeline):
        if event.type == "label" and event.label and event.label.name == label:
            return event.user.login if event.body == "1" and event.user else None
    return None


def assignment_actor(timeline: list[TimelineComment], assignee: str) -> str | None:
    for event in reversed(timeline):
        if event.type == "assignees" and event.assignee and event.assignee.login == assignee:
            return None if event.removed_assignee or event.user is None else event.user.login
    return None


def decide(
    reader: PermissionReader, owner: str, repo: str, issue: Issue, actor: str | None, what: str
) -> Decision:
    if actor is None:
        # No timeline entry (e.g. set when the issue was created): the author applied it.
        actor = issue.user.login
    permission = reader.permission(owner, repo, actor)
    if permission is None:
        return Decision(
            False,
            actor,
            None,
            f"{what} by {actor}, whose permission cannot be read "
            "(configure forge.identities.operator)",
        )
    if permission not in WRITERS:
        return Decision(
            False, actor, permission, f"{what} by {actor}, who has only {permission} permission"
        )
    return Decision(True, actor, permission, f"{what} by {actor} ({permission})")


def still_standing(reader: PermissionReader, owner: str, repo: str, actor: str) -> Decision:
    """Whether ACTOR, who authorised a task's work, may still: their permission now (a
    demotion or a removal changes no issue, so no timeline says so)."""
    permission = reader.permission(owner, repo, actor)
    if permission in WRITERS:
        return Decision(True, actor, permission, f"authorised by {actor} ({permission})")
    now = (
        f"who now has only {permission} permission"
        if permission
        else "whose permission can no longer be read"
    )
    return Decision(False, actor, permission, f"authorised by {actor}, {now}")


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
