"""The verdict on an implementation attempt once its provider has run: a provider
failure lands ready (another try may mend it) or failed; a result goes through the
quality gate and the acceptance rules to implemented, needs_input or failed. A local
model's refused result goes to REFUSE (its one try here: the next provider goes on)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from aiworker.contracts.agent import AgentResult
from aiworker.core.context import Environment
from aiworker.core.evidence.acceptance import refusals
from aiworker.core.evidence.gate import run_gate
from aiworker.core.intake.scope import Requirement
from aiworker.core.phases.engine import ModelRun
from aiworker.core.phases.guard import PhaseGuard
from aiworker.core.phases.implement_outcomes import (
    ImplementReport,
    Running,
    land,
    needs_input,
    retained,
)
from aiworker.core.runner.dispatch import Dispatch
from aiworker.core.tasks.budgets import land_after_failure
from aiworker.core.tasks.states import TaskState as S
from aiworker.runtime.gitcache import GitCache
from aiworker.store.engine import Database

PHASE = "implementation"
# Failures after which another try (maybe another provider) may succeed.
RETRYABLE = ("quota_exhausted", "transient", "auth", "environment", "over_budget")


def judge(
    env: Environment,
    db: Database,
    guard: PhaseGuard,
    running: Running,
    requirements: list[Requirement],
    report: ImplementReport,
    result: AgentResult,
    refuse: Callable[[str, str], ImplementReport],
    *,
    local: bool,
) -> ImplementReport:
    """Run the quality gate on the imported result and decide."""
    gate = run_gate(
        db,
        Dispatch.of(env, db),
        index=running.repo.index,
        slot=running.slot,
        task_id=running.task.id,
        scope=running.task.scope_fingerprint,
        requirements=requirements,
        claimed=result,
    )
    report.gate = {"passed": gate.passed, "checks": gate.checks, "findings": gate.findings}
    if result.questions or result.completion == "needs_input":
        # The agent asks: the author answers by editing it, then it runs again
        # (a small local model's questions do not reach the author: the next provider goes).
        questions = list(result.questions) or [result.summary]
        if local:
            return refuse("needs_input", "; ".join(questions))
        guard.finish("needs_input", "; ".join(questions)[:1000])
        heading = "aiworker needs answers before it can finish this issue:"
        return needs_input(env, db, running, report, questions, heading)
    refused = ([] if gate.passed else ["the quality gate failed"]) + refusals(result)
    outcome = "succeeded" if not refused else "gate_failed" if not gate.passed else "not_accepted"
    if refused and local:
        return refuse(outcome, "; ".join(gate.findings or refused))
    return _judged(db, guard, running, report, outcome, gate.findings or refused, refused)


def provider_failed(
    env: Environment,
    db: Database,
    guard: PhaseGuard,
    running: Running,
    cache: GitCache,
    report: ImplementReport,
    run: ModelRun,
    outcome_bundle: Path | None,
) -> ImplementReport:
    """The provider failed: ready again for a failure another try may mend (a quota
    failure keeps its work for the next provider), else failed."""
    assert run.failure is not None
    quota = run.failure == "quota_exhausted"
    if quota and outcome_bundle is not None:
        index, slot = running.repo.index, running.slot
        report.head = cache.import_result(index, slot, outcome_bundle, "refs/heads/work")
        guard.keep("a quota failure keeps its work for the next provider")
    guard.finish(run.failure, run.reason, refunded=quota)
    retry = run.failure in RETRYABLE
    report.outcome, report.reason = run.failure if retry else "failed", run.reason
    landed = land_after_failure(
        env,
        db,
        running.task.id,
        S.RUNNING,
        running.version,
        PHASE,
        f"{run.failure}: {run.reason}",
        retry_state=S.READY if retry else S.FAILED,
    )
    report.state = landed or "unchanged"
    return report


def _judged(
    db: Database,
    guard: PhaseGuard,
    running: Running,
    report: ImplementReport,
    outcome: str,
    findings: list[str],
    refused: list[str],
) -> ImplementReport:
    """The gate's and the acceptance rules' verdict on a result: implemented, or failed."""
    guard.finish(outcome, "; ".join(findings)[:1000])
    state = S.IMPLEMENTED if not refused else S.FAILED
    reason = (
        "quality gate passed; the result meets every acceptance rule"
        if not refused
        else ("not accepted: " + "; ".join(refused))[:1000]
    )
    accepted = land(
        db,
        running,
        state,
        reason,
        whatever_the_scope=state != S.IMPLEMENTED,
        base_commit=report.base,
        head_commit=report.head,
    )
    if not accepted:
        return retained(db, guard, running, report)
    report.outcome, report.reason, report.state = str(state), reason, state
    return report
