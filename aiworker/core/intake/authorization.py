"""Who applied the label or the assignment, and may they? Verified on every poll.

Forgejo answers permission queries about other users only to repository
admins, so an optional operator identity (an admin, used for nothing else)
reads them. Without it, only what the bot identities may read is known: their
own permission, and the repository owner.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.errors import ForgeForbidden, ForgeNotFound
from aiworker.adapters.forgejo.models import Issue, TimelineComment
from aiworker.config.models import Config
from aiworker.core.intake.scope import fingerprint

WRITERS = ("write", "admin", "owner")


@dataclass(frozen=True)
class Decision:
    authorized: bool
    actor: str | None
    permission: str | None
    reason: str
    item: int | None = None  # the timeline item that authorised it (None: at creation)


@dataclass(frozen=True)
class Covered:
    """What a task's authorisation covered as last recorded: the scope, and the timeline
    item that authorised it."""

    scope: str | None
    item: int | None


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


def label_actor(timeline: list[TimelineComment], label: str) -> tuple[str | None, int | None]:
    """Who last added LABEL (Forgejo marks an addition with body "1"), and its item."""
    for event in reversed(timeline):
        if event.type == "label" and event.label and event.label.name == label:
            added = event.body == "1" and event.user is not None
            return (event.user.login, event.id) if added and event.user else (None, None)
    return None, None


def assignment_actor(
    timeline: list[TimelineComment], assignee: str
) -> tuple[str | None, int | None]:
    """Who last assigned ASSIGNEE, and its item."""
    for event in reversed(timeline):
        if event.type == "assignees" and event.assignee and event.assignee.login == assignee:
            if event.removed_assignee or event.user is None:
                return None, None
            return event.user.login, event.id
    return None, None


def decide(
    reader: PermissionReader,
    owner: str,
    repo: str,
    issue: Issue,
    actor: str | None,
    what: str,
    item: int | None = None,
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
    return Decision(True, actor, permission, f"{what} by {actor} ({permission})", item)


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
    covered: Covered | None = None,
) -> Decision:
    """Decide now, from the issue's timeline, whether the work was authorised; with
    COVERED (a known task's), whether that authorisation covers the issue as it reads."""
    timeline = client.timeline(owner, name, issue.number)
    if kind == "issue":
        actor, item = assignment_actor(timeline, worker_login)
        what = f"assigned to {worker_login}"
    else:
        label = config.labels.plan if kind == "plan" else config.labels.feature
        actor, item = label_actor(timeline, label)
        what = f"labelled {label}"
    decision = decide(reader, owner, name, issue, actor, what, item)
    if not decision.authorized:
        return decision
    return within_scope(decision, covered, reader, owner, name, issue, config)


def within_scope(
    decision: Decision,
    covered: Covered | None,
    reader: PermissionReader,
    owner: str,
    repo: str,
    issue: Issue,
    config: Config,
) -> Decision:
    """DECISION, if it covers the issue as it reads now: a writer authorised it since the
    scope COVERED was recorded, or it has not changed since, or its author may authorise
    (nobody else without write permission can edit an issue; the forge does not say who
    did). Else the change is the author's word alone, and a writer must authorise it."""
    scope = fingerprint(issue, config.labels.approved)
    # No item recorded (a task from before items were): this authorisation is recorded.
    renewed = covered is not None and (covered.item is None or decision.item != covered.item)
    if covered is None or renewed or covered.scope in (None, scope):
        return decision
    author = issue.user.login
    permission = reader.permission(owner, repo, author)
    if permission in WRITERS:
        return decision
    has = f"only {permission} permission" if permission else "a permission that cannot be read"
    again = "assign it" if decision.reason.startswith("assigned") else "apply the label"
    return replace(
        decision,
        authorized=False,
        reason=(
            f"the issue changed after it was {decision.reason}, and its author {author} has "
            f"{has}: a writer must authorise the new text ({again} again)"
        ),
    )
