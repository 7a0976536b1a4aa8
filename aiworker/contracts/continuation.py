"""What carries over from one phase to the next: one documented file, never a conversation.

Every phase starts a fresh provider session. Beside its prompt it finds
`continuation.json`: the scope it works to, the base and head it starts from, the
commits already on the work, the findings and evidence so far, and how earlier
attempts ended. Its schema is `aiworker runner schema continuation`.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, StringConstraints

from aiworker.contracts.agent import Finding
from aiworker.contracts.base import Contract

CONTINUATION_CONTRACT: Final = "ait.continuation.v1"
Hash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}([0-9a-f]{24})?$")]
Short = Annotated[str, StringConstraints(max_length=2_000)]


class Scope(Contract):
    title: Short
    fingerprint: str | None
    checks: list[list[str]]  # each required check as [check_id, *argv]


class Evidence(Contract):
    phase: str
    check_id: str | None
    outcome: str
    head: Hash
    base: Hash


class PriorAttempt(Contract):
    phase: str
    provider: str | None
    outcome: str | None
    reason: Short | None


class Continuation(Contract):
    contract: Literal["ait.continuation.v1"] = CONTINUATION_CONTRACT
    task: Annotated[int, Field(ge=1)]
    phase: str
    scope: Scope
    base: Hash
    head: Hash | None = None
    commits: Annotated[list[Hash], Field(max_length=500)] = []
    findings: Annotated[list[Finding], Field(max_length=200)] = []
    evidence: Annotated[list[Evidence], Field(max_length=200)] = []
    attempts: Annotated[list[PriorAttempt], Field(max_length=200)] = []
