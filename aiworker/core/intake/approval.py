"""Plan approval, read from the issue's timeline like every other authorisation.

A plan is approved by a user with write permission who, after the plan was posted
(or after the plan was paused for a changed scope), applies the approval label
(and it is still applied) or comments the approval command. Forgejo's timeline
items share one sequence of ids, so "after" is an item id, exact even within the
same second.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiworker.adapters.forgejo.models import TimelineComment
from aiworker.core.intake.authorization import WRITERS, PermissionReader


@dataclass(frozen=True)
class Approval:
    approved: bool
    actor: str | None
    item: int | None  # the timeline item that approved
    reason: str


def read_approval(
    timeline: list[TimelineComment],
    reader: PermissionReader,
    owner: str,
    repo: str,
    *,
    label: str,
    command: str,
    after: int,
) -> Approval:
    """Whether a writer approved after timeline item AFTER, and who; the newest approval
    by a writer counts, and one by a user without write permission is ignored."""
    candidates: list[tuple[int, str, str]] = []
    for item in reversed(timeline):
        if item.type == "label" and item.label and item.label.name == label:
            if item.body == "1" and item.id > after and item.user:
                candidates.append((item.id, item.user.login, f"labelled {label}"))
            break  # the label's latest event says whether it is applied now
    for item in timeline:
        if (
            item.type == "comment"
            and item.id > after
            and item.user
            and item.body.strip().lower() == command.strip().lower()
        ):
            candidates.append((item.id, item.user.login, f"commented {command}"))
    ignored = []
    for item_id, login, how in sorted(candidates, reverse=True):
        permission = reader.permission(owner, repo, login)
        if permission in WRITERS:
            return Approval(True, login, item_id, f"{how} by {login} ({permission})")
        ignored.append(f"{how} by {login} ({permission or 'permission unknown'})")
    if ignored:
        return Approval(False, None, None, "ignored: " + "; ".join(ignored))
    return Approval(False, None, None, "no approval by a writer yet")


def last_item(timeline: list[TimelineComment]) -> int:
    """The newest timeline item's id (0 when there is none)."""
    return max((item.id for item in timeline), default=0)
