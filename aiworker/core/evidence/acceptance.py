"""Acceptance by rule, not by prose: what in an agent's own result forbids accepting it.

A result is accepted only when it says it is complete and nothing in it says
otherwise: every acceptance criterion it reports is satisfied, it names no blockers
and asks no questions, it signals no change of scope, and it reports no blocking
finding. Its summary counts for nothing. The quality gate's re-run of the checks is
judged separately (evidence/gate.py).
"""

from __future__ import annotations

from aiworker.contracts.agent import AgentResult


def refusals(result: AgentResult) -> list[str]:
    """Why RESULT cannot be accepted, one sentence each; empty when it can."""
    reasons = []
    if result.completion != "complete":
        reasons.append(f"the agent reported {result.completion}, not complete")
    for criterion in result.criteria:
        if not criterion.satisfied:
            reasons.append(f"criterion not satisfied: {criterion.criterion[:200]}")
    reasons += [f"blocker: {blocker[:200]}" for blocker in result.blockers]
    reasons += [f"open question: {question[:200]}" for question in result.questions]
    if result.scope.changed:
        reasons.append(f"the scope changed: {result.scope.note[:200] or 'no note'}")
    for finding in result.findings:
        if finding.severity == "blocker":
            where = f" ({finding.path})" if finding.path else ""
            reasons.append(f"blocking finding{where}: {finding.message[:200]}")
    return reasons
