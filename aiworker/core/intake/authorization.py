"""Who applied the label or the assignment, and may they? Verified on every poll.

Forgejo answers permission queries about other users only to repository
admins, so an optional operator identity (an admin, used for nothing else)
reads them. Without it, only what the bot identities may read is known: their
own permission, and the repository owner.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.errors import ForgeForbidden, ForgeNotFound, ForgeTokenScope
from aiworker.adapters.forgejo.models import Issue, TimelineComment
from aiworker.config.models import Config
from aiworker.core.intake.scope import authored

WRITERS = ("write", "admin", "owner")


@dataclass(frozen=True)
class Decision:
    authorized: bool
    actor: str | None
    permission: str | None
    reason: str
    item: int | None = None  # the timeline item that authorised it (None: at creation)
    item_at: datetime | None = None  # when that item was made
    scope: str | None = None  # what of the issue it covers now (scope.authored)


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
        except ForgeTokenScope:
            raise  # the reader's token lacks a scope: the operator must fix it, not the author
        except (ForgeForbidden, ForgeNotFound):
            return None


def label_event(timeline: list[TimelineComment], label: str) -> TimelineComment | None:
    """The item that last added LABEL (Forgejo marks an addition with body "1"), if it
    stands (not removed since) and names who added it."""
    for event in reversed(timeline):
        if event.type == "label" and event.label and event.label.name == label:
            return event if event.body == "1" and event.user is not None else None
    return None


def assignment_event(timeline: list[TimelineComment], assignee: str) -> TimelineComment | None:
    """The item that last assigned ASSIGNEE, if it stands and names who did."""
    for event in reversed(timeline):
        if event.type == "assignees" and event.assignee and event.assignee.login == assignee:
            return None if event.removed_assignee or event.user is None else event
    return None


def decide(
    reader: PermissionReader,
    owner: str,
    repo: str,
    issue: Issue,
    actor: str | None,
    what: str,
    item: TimelineComment | None = None,
) -> Decision:
    """Whether ACTOR (by timeline ITEM) may authorise the work WHAT describes."""
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
    return Decision(
        True,
        actor,
        permission,
        f"{what} by {actor} ({permission})",
        item.id if item is not None else None,
        item.created_at if item is not None else None,
    )


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
    COVERED (a known task's), whether that authorisation covers the issue as it reads.
    An issue that no longer carries the assignment or the label asks for nothing, whoever
    its author is (a person took the request back)."""
    if kind == "issue":
        asks = any(user.login == worker_login for user in issue.assignees)
        what = f"assigned to {worker_login}"
    else:
        label = config.labels.plan if kind == "plan" else config.labels.feature
        asks = label in issue.label_names
        what = f"labelled {label}"
    if not asks:
        return Decision(False, None, None, f"the issue is no longer {what}")
    timeline = client.timeline(owner, name, issue.number)
    if kind == "issue":
        event = assignment_event(timeline, worker_login)
    else:
        event = label_event(timeline, label)
    actor = event.user.login if event is not None and event.user is not None else None
    decision = decide(reader, owner, name, issue, actor, what, event)
    if not decision.authorized:
        return decision
    decision = not_reopened_over_a_writer(decision, timeline, event, reader, owner, name, issue)
    if not decision.authorized:
        return decision
    return within_scope(decision, covered, reader, owner, name, issue)


def not_reopened_over_a_writer(
    decision: Decision,
    timeline: list[TimelineComment],
    item: TimelineComment | None,
    reader: PermissionReader,
    owner: str,
    repo: str,
    issue: Issue,
) -> Decision:
    """DECISION, unless a writer closed the open ISSUE after ITEM authorised the work and
    only people without write permission reopened it since: an author may reopen their
    own issue, but that does not overrule a writer who closed it."""
    closer, reopener = None, ""
    after = item is None
    for entry in timeline:
        after = after or entry is item
        if not after or entry.type not in ("close", "reopen"):
            continue
        who = entry.user.login if entry.user is not None else ""
        writer = bool(who) and reader.permission(owner, repo, who) in WRITERS
        if entry.type == "close" and writer:
            closer = who
        elif entry.type == "reopen":
            closer, reopener = (None, "") if writer else (closer, who or "a deleted user")
    if closer is None or issue.state != "open":
        return decision
    return replace(
        decision,
        authorized=False,
        reason=(
            f"{closer}, a writer, closed the issue after it was {decision.reason}, and only "
            f"{reopener}, who may not authorise work, reopened it since: a writer must "
            "reopen it, or authorise it again"
        ),
    )


def within_scope(
    decision: Decision,
    covered: Covered | None,
    reader: PermissionReader,
    owner: str,
    repo: str,
    issue: Issue,
) -> Decision:
    """DECISION, with the scope it covers, if it covers the issue as its author may have
    changed it: unchanged since COVERED was recorded (nothing recorded yet: a task from
    before coverage was, until its next poll), or authorised anew by an item made after
    the issue's last change, or by an author who may authorise (nobody else without
    write permission can edit an issue, and the forge does not say who did). Else the
    change is the author's word alone, and a writer must authorise it."""
    scope = authored(issue)
    covers = replace(decision, scope=scope)
    if covered is None or covered.scope in (None, scope):
        return covers
    renewed = decision.item is not None and decision.item != covered.item
    if renewed and decision.item_at is not None and decision.item_at >= issue.updated_at:
        return covers  # the newest change to the issue: made knowing its text
    author = issue.user.login
    permission = reader.permission(owner, repo, author)
    if permission in WRITERS:
        return covers
    has = f"only {permission} permission" if permission else "a permission that cannot be read"
    again = "assign it" if decision.reason.startswith("assigned") else "apply the label"
    return replace(
        decision,
        authorized=False,
        reason=(
            f"the issue changed after it was {decision.reason}, and its author {author} has "
            f"{has}: a writer must authorise the new text ({again} again, as the last change "
            "to the issue before aiworker's next poll)"
        ),
    )
