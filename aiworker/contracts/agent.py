"""The agent result document every phase returns; its JSON Schema is handed to providers.

The host validates it strictly and never trusts prose: a claimed passing check
is re-run by the quality gate before anything is published.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, StringConstraints

from aiworker.contracts.base import Contract

AGENT_RESULT_CONTRACT: Final = "ait.agent.result.v1"
Text = Annotated[str, StringConstraints(max_length=20_000)]
CheckId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")]


class Finding(Contract):
    severity: Literal["info", "minor", "major", "blocker"]
    message: Text
    path: str | None = None
    line: Annotated[int, Field(ge=1)] | None = None


class CriterionEvidence(Contract):
    criterion: Text
    satisfied: bool
    evidence: Text


class ValidationAttempt(Contract):
    check_id: CheckId
    command: Annotated[list[str], Field(min_length=1, max_length=64)]
    exit_code: int
    expected_exit_code: int = 0
    measurements: dict[str, float] = {}


class ScopeSignal(Contract):
    changed: bool = False
    note: Text = ""


class QuotaSignal(Contract):
    exhausted: bool = False
    note: Text = ""


class MilestoneThreshold(Contract):
    """A measurement the check must report and its bound (evidence/measurements.py)."""

    name: CheckId
    op: Literal["<=", ">="]
    value: float
    relative: bool = False  # VALUE times the same measurement at the base
    obligation: Literal["passing", "advisory"] = "passing"


class MilestoneCheck(Contract):
    """A check the host re-runs at the milestone's head: `./ci/run ARGS` under CHECK_ID."""

    check_id: CheckId
    thresholds: Annotated[list[MilestoneThreshold], Field(max_length=16)] = []
    command: Annotated[
        list[Annotated[str, StringConstraints(max_length=500)]], Field(min_length=1, max_length=32)
    ]


class MilestoneSpec(Contract):
    """One milestone of a plan (planning results only); bounded in every field."""

    title: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    scope: Annotated[str, StringConstraints(min_length=1, max_length=8_000)]
    acceptance_criteria: Annotated[
        list[Annotated[str, StringConstraints(min_length=1, max_length=1_000)]],
        Field(min_length=1, max_length=20),
    ]
    validation: Annotated[list[MilestoneCheck], Field(max_length=16)] = []
    # Small enough for the simple_implementation settings and the local model.
    simple: bool = False


class AgentResult(Contract):
    contract: Literal["ait.agent.result.v1"]
    completion: Literal["complete", "blocked", "needs_input", "failed"]
    summary: Text
    blockers: list[Text] = []
    questions: list[Text] = []
    findings: list[Finding] = []
    criteria: list[CriterionEvidence] = []
    validation: list[ValidationAttempt] = []
    scope: ScopeSignal = ScopeSignal()
    quota: QuotaSignal = QuotaSignal()
    # A planning result's milestones, in order (the host bounds their number: planning).
    milestones: Annotated[list[MilestoneSpec], Field(max_length=32)] = []
