"""The report of a model phase's attempt (plan, implement, repair): the command's
`--json` document and its exit code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiworker.core.phases.job import Job
from aiworker.core.phases.outcome import Outcome
from aiworker.core.report import Report
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import EXIT_FAILED, EXIT_OK, EXIT_UNAVAILABLE


@dataclass
class AttemptReport(Report):
    task: int
    # implemented | ready | failed | needs_input | unavailable | retained | stopped |
    # fell_back (a local model's one try failed; the next provider takes it) | paused |
    # repairing, or the failure class of a retryable failure
    outcome: str
    provider: str | None = None
    attempt: int | None = None
    base: str | None = None
    head: str | None = None
    gate: dict[str, Any] | None = None
    reason: str = ""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    state: str = ""

    @property
    def exit_code(self) -> int:
        if self.outcome == "implemented":
            return EXIT_OK
        return EXIT_UNAVAILABLE if self.outcome == "unavailable" else EXIT_FAILED

    def landed(self, state: str, refusal: str | None) -> None:
        self.state = state
        if refusal is not None:
            self.outcome, self.reason = "retained", refusal
        elif state == S.FAILED and self.outcome in ("fell_back", "repairing"):
            self.outcome = "failed"  # the budget was spent: nothing goes on


def ended(report: AttemptReport, state: str, outcome: str, reason: str) -> Outcome:
    """The phase ends without an accepted result: the task goes to STATE."""
    report.outcome, report.reason = outcome, reason
    # No provider now: checking again at once would find none either.
    return Outcome(report, state, reason, follow_up=outcome != "unavailable")


def needs_input(
    report: AttemptReport,
    problems: list[str],
    heading: str = "aiworker cannot start on this issue yet; nothing was run. Please fix:",
) -> Outcome:
    """The issue must change first: the problems are commented once the move is made."""
    reason = "; ".join(problems)
    report.outcome, report.reason = "needs_input", reason
    comment = (
        heading
        + "\n"
        + "\n".join(f"- {p}" for p in problems)
        + "\n\nEditing the issue makes it eligible again."
    )
    return Outcome(report, S.NEEDS_INPUT, reason, comment=comment)


def stopped(job: Job, report: AttemptReport) -> Outcome | None:
    """None while the task is still the job's own; else it was paused or cancelled before
    the provider ran, and the phase stops, spending nothing."""
    now = job.now()
    if now is not None and now.state == job.holds and now.claim_token == job.token:
        return None
    state = now.state if now is not None else "gone"
    report.outcome = "stopped"
    report.reason = f"the task became {state} before the provider ran; nothing was spent"
    return Outcome(report)
