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
