"""A plan, recorded before it is posted: a planning run that dies after the model answered
(before or after the plan reached the issue) leaves a plan the next run posts (or finds
posted) as it was, so no inference is spent twice and no plan is posted twice. A plan
recorded for another base or another scope of the issue is not taken up."""

from __future__ import annotations

from collections.abc import Sequence

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.contracts.agent import MilestoneSpec
from aiworker.store.engine import Database
from aiworker.store.task_records import last_event_of
from aiworker.store.tasks import append_event

DECIDED = "plan.decided"
POSTED = "plan.posted"  # the event of the move to awaiting approval


def plan_marker(task_id: int, decision: int) -> str:
    return f"<!-- aiworker:plan-decision task={task_id} decision={decision} -->"


def record_plan(
    db: Database, task_id: int, base: str, scope: str, milestones: Sequence[MilestoneSpec]
) -> int:
    """Record the plan; the number its posted comment is known by."""
    data = {
        "base": base,
        "scope": scope,
        "milestones": [m.model_dump(exclude_none=True) for m in milestones],
    }
    with db.write() as session:
        append_event(session, DECIDED, task_id=task_id, data=data)
        recorded = last_event_of(session, task_id, DECIDED)
        assert recorded is not None
        return int(recorded.id)


def pending_plan(
    db: Database, task_id: int, base: str, scope: str
) -> tuple[int, list[MilestoneSpec]] | None:
    """The plan recorded for BASE and SCOPE that no run posted and moved on with."""
    with db.read() as session:
        decided = last_event_of(session, task_id, DECIDED)
        posted = last_event_of(session, task_id, POSTED)
        if decided is None or (posted is not None and posted.id > decided.id):
            return None
        number, data = int(decided.id), dict(decided.data)
    if (data.get("base"), data.get("scope")) != (base, scope):
        return None
    return number, [MilestoneSpec.model_validate(m) for m in data["milestones"]]


def posted_plan(
    planner: ForgejoClient, login: str, owner: str, repo: str, issue: int, marker: str
) -> int | None:
    """The comment a dead run posted for this plan (by the planner, with its marker)."""
    for comment in planner.comments(owner, repo, issue):
        if comment.user.login == login and marker in comment.body:
            return comment.id
    return None
