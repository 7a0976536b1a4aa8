"""A review's decision, recorded before anything is posted: a run that dies after the model
answered (before or after the review reached the forge) leaves a decision the next run
delivers as it is, so no inference is spent twice and no review is posted twice."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from aiworker.contracts.agent import AgentResult, Finding
from aiworker.core.tasks.states import TaskState as S
from aiworker.store.engine import Database
from aiworker.store.task_records import last_entry_into, last_event_of
from aiworker.store.tasks import append_event

DECIDED = "review.decided"
BLOCKING = ("major", "blocker")


@dataclass(frozen=True)
class Decided:
    event: str  # APPROVED | REQUEST_CHANGES
    head: str
    provider: str | None
    summary: str
    completion: str
    findings: list[Finding] = field(default_factory=list)
    decision: int | None = None  # the event that recorded it, once recorded

    @classmethod
    def of(cls, result: AgentResult, provider: str, head: str) -> Decided:
        blocking = [f for f in result.findings if f.severity in BLOCKING]
        complete = result.completion == "complete"
        event = "REQUEST_CHANGES" if blocking or not complete else "APPROVED"
        return cls(event, head, provider, result.summary, result.completion, list(result.findings))

    def to_data(self) -> dict[str, Any]:
        """What the decision's event records: every field but the event's own id."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "decision"}
        return {**data, "findings": [f.model_dump(exclude_none=True) for f in self.findings]}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Decided:
        return cls(
            str(data["event"]),
            str(data["head"]),
            data.get("provider"),
            str(data.get("summary", "")),
            str(data.get("completion", "complete")),
            [Finding.model_validate(f) for f in data.get("findings", [])],
        )


def review_marker(task_id: int, decided: Decided) -> str:
    """What a posted review carries so that a later run knows it as the one posted for
    this decision (not an earlier review of the same head, after a repair that needed no
    commit)."""
    return f"<!-- aiworker:review task={task_id} decision={decided.decision} -->"


def review_body(decided: Decided | AgentResult) -> str:
    lines = [decided.summary]
    for finding in decided.findings:
        where = (
            f" ({finding.path}:{finding.line})"
            if finding.path and finding.line
            else (f" ({finding.path})" if finding.path else "")
        )
        lines.append(f"- [{finding.severity}] {finding.message}{where}")
    return "\n".join(lines)


def record_decision(db: Database, task_id: int, decided: Decided) -> Decided:
    """DECIDED, recorded: with the number a posted review is known by."""
    with db.write() as session:
        append_event(session, DECIDED, task_id=task_id, data=decided.to_data())
        recorded = last_event_of(session, task_id, DECIDED)
        assert recorded is not None
        number = recorded.id
    return replace(decided, decision=number)


def pending_decision(db: Database, task_id: int, head: str) -> Decided | None:
    """The decision on HEAD recorded since the task last came to await a review, which no
    run delivered (delivering it moves the task on)."""
    with db.read() as session:
        decided = last_event_of(session, task_id, DECIDED)
        entered = last_entry_into(session, task_id, S.AWAITING_REVIEW)
        if decided is None or (entered is not None and decided.id < entered.id):
            return None
        data, number = dict(decided.data), decided.id
    if data.get("head") != head:
        return None
    return replace(Decided.from_data(data), decision=number)
