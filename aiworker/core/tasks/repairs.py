"""Repair requests: review findings, a red CI or a base move that cannot be taken as it is
send the task back to work on its own branch instead of ending it.

A request says why (its cause), the commit the episode starts from, the base its result
must contain, and the findings it must resolve; it is recorded as a `repair.requested`
event and the task moves to repairing without a slot, where it waits for one like ready
work (store/tasks.claim_next). The repair budget (budgets.repair episodes) bounds the
loop: a request past it ends the task as failed with the unresolved findings commented
on the issue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiworker.contracts.agent import Finding
from aiworker.core.context import Environment
from aiworker.core.evidence.causes import CAUSES
from aiworker.core.tasks.budgets import RELEASE, attempts_summary, spent
from aiworker.core.tasks.lifecycle import advance
from aiworker.core.tasks.notices import comment_on_issue
from aiworker.core.tasks.states import TaskState as S
from aiworker.secrets import redact
from aiworker.store.engine import Database
from aiworker.store.models import Task
from aiworker.store.task_records import last_event_of

PHASE = "repair"
REQUESTED = "repair.requested"
MAX_FINDINGS = 50


@dataclass(frozen=True)
class RepairRequest:
    cause: str
    start: str  # the episode's work starts from this commit (the branch's current head)
    base: str  # the base its result must contain and is checked on
    findings: list[Finding] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # files left with conflict markers

    def __post_init__(self) -> None:
        # Refused where it is made, not when an episode later has no prompt for it.
        if self.cause not in CAUSES:
            raise ValueError(f"unknown repair cause {self.cause!r}")

    def to_data(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "start": self.start,
            "base": self.base,
            "findings": [f.model_dump(exclude_none=True) for f in self.findings[:MAX_FINDINGS]],
            "conflicts": self.conflicts[:MAX_FINDINGS],
        }

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> RepairRequest:
        return cls(
            str(data["cause"]),
            str(data["start"]),
            str(data["base"]),
            [Finding.model_validate(f) for f in data.get("findings", [])],
            [str(p) for p in data.get("conflicts", [])],
        )


def latest_request(db: Database, task_id: int) -> RepairRequest | None:
    with db.read() as session:
        event = last_event_of(session, task_id, REQUESTED)
        return None if event is None else RepairRequest.from_data(dict(event.data))


def finding_lines(findings: Sequence[Finding], *, limit: int = 20, length: int = 2_000) -> str:
    """The findings as a list a person reads: at most LIMIT, each cut to LENGTH characters,
    secrets masked."""
    lines = []
    for finding in findings[:limit]:
        where = finding.path + (f":{finding.line}" if finding.line else "") if finding.path else ""
        message = (
            finding.message if len(finding.message) <= length else finding.message[:length] + " ..."
        )
        lines.append(f"- [{finding.severity}] {message}" + (f" ({where})" if where else ""))
    if len(findings) > limit:
        lines.append(f"- and {len(findings) - limit} more")
    return redact("\n".join(lines)) or "- (no findings were recorded)"


def request_repair(
    env: Environment,
    db: Database,
    task: Task,
    from_state: str,
    request: RepairRequest,
    why: str,
    **changes: object,
) -> str:
    """Move TASK (as loaded, in FROM_STATE) to repairing with REQUEST, or to failed when the
    repair budget is spent; returns the state landed in. TASK.version follows the move;
    CHANGES are recorded on the task with it."""
    used, allowed = spent(env, db, task.id, PHASE)
    exhausted = used >= allowed
    target = S.FAILED if exhausted else S.REPAIRING
    reason = f"{why}; the repair budget of {allowed} episodes is spent" if exhausted else f"{why}"
    with db.write() as session:
        task.version = advance(
            session,
            task.id,
            from_state,
            task.version,
            target,
            reason[:1000],
            actor=PHASE,
            kind="task.failed" if exhausted else REQUESTED,
            data={"phase": PHASE, "used": used, "limit": allowed, **request.to_data()},
            follow_data_changes=True,
            **{**RELEASE, **changes},
        )
    if exhausted:
        comment_on_issue(
            env,
            db,
            task.id,
            f"aiworker stopped working on this: {allowed} repair episodes did not resolve "
            f"these findings ({redact(why)}):\n{finding_lines(request.findings, length=500)}\n\n"
            f"Attempts:\n{attempts_summary(db, task.id)}\n\n"
            "An operator can run `aiworker task retry` once the cause is fixed.",
        )
    return str(target)


def record_refreshed_base(db: Database, task: Task, head: str, base: str) -> int:
    """The moved BASE was merged into the work as HEAD and every required check passed
    there: the implemented task records them (its new version is returned), and
    publication goes ahead on those receipts instead of a repair."""
    with db.write() as session:
        return advance(
            session,
            task.id,
            S.IMPLEMENTED,
            task.version,
            S.IMPLEMENTED,
            f"the base moved to {base[:12]}: merged it into the work as {head[:12]}; "
            "every required check passed there",
            actor="publish",
            kind="task.base_refreshed",
            data={"from_base": task.base_commit, "base": base, "head": head},
            head_commit=head,
            base_commit=base,
        )
