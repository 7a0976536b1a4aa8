"""The verdict on an implementation attempt once its provider has run: a provider
failure lands ready (another try may mend it) or failed; a result goes through the
quality gate and the acceptance rules to implemented, needs_input or failed. A local
model's refused result falls back instead (its one try here: the next provider goes on)."""

from __future__ import annotations

import logging
from pathlib import Path

from aiworker.contracts.agent import AgentResult
from aiworker.core.evidence.acceptance import refusals
from aiworker.core.evidence.gate import run_gate
from aiworker.core.evidence.requirements import Requirement
from aiworker.core.phases.job import Job
from aiworker.core.phases.model_run import ModelRun
from aiworker.core.phases.outcome import Outcome
from aiworker.core.phases.reports import AttemptReport, needs_input
from aiworker.core.providers.registry import fallbacks
from aiworker.core.runner.dispatch import Dispatch
from aiworker.core.tasks.states import TaskState as S
from aiworker.runtime.gitcache import GitCache
from aiworker.store.attempts import providers_tried_at

log = logging.getLogger(__name__)
# Failures after which another try (maybe another provider) may succeed.
RETRYABLE = ("quota_exhausted", "transient", "auth", "environment", "over_budget")


def judge(
    job: Job,
    requirements: list[Requirement],
    report: AttemptReport,
    result: AgentResult,
    *,
    local: bool,
    simple: bool,
) -> Outcome:
    """Run the quality gate on the imported result and decide."""
    gate = run_gate(
        job.db,
        Dispatch.of(job.env, job.db, job.attempt),
        index=job.repo.index,
        slot=job.slot or 0,
        task_id=job.task.id,
        scope=job.task.scope_fingerprint,
        requirements=requirements,
        claimed=result,
    )
    report.gate = {"passed": gate.passed, "checks": gate.checks, "findings": gate.findings}
    if result.questions or result.completion == "needs_input":
        # The agent asks: the author answers by editing it, then it runs again
        # (a small local model's questions do not reach the author: the next provider goes).
        questions = list(result.questions) or [result.summary]
        if local:
            return fell_back(job, report, "needs_input", "; ".join(questions), simple=simple)
        heading = "aiworker needs answers before it can finish this issue:"
        return needs_input(report, questions, heading).ended("needs_input", "; ".join(questions))
    unmet = ([] if gate.passed else ["the quality gate failed"]) + refusals(result)
    outcome = "succeeded" if not unmet else "gate_failed" if not gate.passed else "not_accepted"
    findings = "; ".join(gate.findings or unmet)
    changes = {"base_commit": report.base, "head_commit": report.head}
    if unmet:
        reason = ("not accepted: " + "; ".join(unmet))[:1000]
        if local:
            return fell_back(job, report, outcome, findings, simple=simple)
        report.outcome, report.reason = "failed", reason
        return Outcome(report, S.FAILED, reason, changes).ended(outcome, findings)
    reason = "quality gate passed; the result meets every acceptance rule"
    report.outcome, report.reason = str(S.IMPLEMENTED), reason
    return Outcome(report, S.IMPLEMENTED, reason, changes, scoped=True).ended(outcome, findings)


def refused(
    job: Job, report: AttemptReport, outcome: str, reason: str, local: bool, simple: bool
) -> Outcome:
    """A result that cannot be taken (no commits, not descending from the base)."""
    if local:
        return fell_back(job, report, outcome, reason, simple=simple)
    report.outcome, report.reason = "failed", reason
    log.warning("task %d: %s", job.task.id, reason)
    return Outcome(report, S.FAILED, reason).ended("failed", reason)


def provider_failed(
    job: Job, cache: GitCache, report: AttemptReport, run: ModelRun, outcome_bundle: Path | None
) -> Outcome:
    """The provider failed: ready again for a failure another try may mend (a quota
    failure keeps its work for the next provider), else failed."""
    assert run.failure is not None
    quota = run.failure == "quota_exhausted"
    if quota and outcome_bundle is not None:
        index, slot = job.repo.index, job.slot or 0
        report.head = cache.import_result(index, slot, outcome_bundle, "refs/heads/work")
        job.keep("a quota failure keeps its work for the next provider")
    retry = run.failure in RETRYABLE
    report.outcome, report.reason = run.failure if retry else "failed", run.reason
    why = f"{run.failure}: {run.reason}"
    landing = Outcome(report, retry=S.READY if retry else S.FAILED, reason=why)
    return landing.ended(run.failure, run.reason, refunded=quota)


def fell_back(
    job: Job, report: AttemptReport, outcome: str, reason: str, *, simple: bool
) -> Outcome:
    """A local model's one try at this snapshot ended without an accepted result (no
    result, over a bound or its diff budget, refused by the gate, questions): the attempt
    is recorded as it ended, and the task goes back to ready for the next provider in
    order, on the same attempt budget. It fails only when no other provider could take
    it, or the budget is spent."""
    with job.db.read() as session:
        tried = providers_tried_at(session, job.task.id, report.base or "")
    left = fallbacks(job.env, job.phase.name, simple=simple, tried_here=tried)
    why = f"{report.provider}'s local try ended {outcome}: {reason}"
    if not left:
        why += "; no other configured provider can take this issue"
    report.outcome, report.reason = "fell_back", why
    log.warning("task %d: %s", job.task.id, why)
    landing = Outcome(report, retry=S.READY if left else S.FAILED, reason=why[:1000])
    return landing.ended(outcome, reason)
