"""aiworker's own CI status on a commit: its context, and whose word counts."""

from __future__ import annotations

from collections.abc import Collection

from aiworker.adapters.forgejo.models import CommitStatus

CI_CONTEXT = "aiworker / ci"


def ours_passed(statuses: list[CommitStatus], ours: Collection[str | None]) -> bool:
    """Whether one of OURS posted a success in aiworker's CI context among STATUSES: only
    our own CI's word counts, as anyone with Write can post a status in its context."""
    return any(
        s.context == CI_CONTEXT
        and s.status == "success"
        and s.creator is not None
        and s.creator.login in ours
        for s in statuses
    )
