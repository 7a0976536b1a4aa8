"""A scope that moved after the work was done: the task goes to a repair episode, never on
to publication or merge with work done for requirements that no longer stand."""

from __future__ import annotations

from aiworker.adapters.forgejo.models import Issue
from aiworker.contracts.agent import Finding
from aiworker.core.context import Environment
from aiworker.core.evidence.gate import PHASE as VALIDATION
from aiworker.core.intake.scope import fingerprint
from aiworker.core.tasks.repairs import RepairRequest, request_repair
from aiworker.store.engine import Database
from aiworker.store.models import Task
from aiworker.store.receipts import receipts_for

# Plans answer a changed scope with a new approval (delivery/milestones.py, publish).
REPAIRABLE = ("issue", "feature")


def repair_if_scope_moved(
    env: Environment, db: Database, task: Task, issue: Issue, from_state: str
) -> str | None:
    """When ISSUE's requirements are no longer those the work at the task's head was checked
    for, request a repair (cause `scope`) with the new scope recorded, and say why; None
    when the scope stands. TASK (in FROM_STATE) follows the move."""
    if task.kind not in REPAIRABLE or not task.head_commit or not task.base_commit:
        return None
    scope = fingerprint(issue, env.loaded.config.labels.approved)
    with db.read() as session:
        checked_for = {
            r.scope_fingerprint
            for r in receipts_for(session, task.id, VALIDATION)
            if r.head_commit == task.head_commit
        }
    if scope == task.scope_fingerprint and (not checked_for or scope in checked_for):
        return None
    why = "the issue's requirements changed after the work was done"
    finding = Finding(
        severity="blocker",
        message=f"{why}: make the work meet the request as it reads now (the issue's text)",
    )
    request = RepairRequest("scope", task.head_commit, task.base_commit, [finding])
    state = request_repair(env, db, task, from_state, request, why, scope_fingerprint=scope)
    return f"{why}; the task is {state}"
