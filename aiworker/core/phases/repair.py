"""`aiworker repair --task ID --slot N`: one repair episode on the task's own branch.

A review that requested changes, a red CI or a base move that could not be taken
as it was (tasks/repairs.py) left a request: its cause, the commit to start from,
the base the result must contain and the findings. The episode is a fresh
implementation session (its own provider choice; never the simple-only local
route) in a workspace at that commit, with the findings and the evidence in
`continuation.json`. Its commits must descend from the start (no work is
discarded) and contain the base; files a conflict left must be free of markers;
the quality gate re-runs every required check at the new head. An accepted
episode returns the task to implemented, so publication pushes the new head to
the same PR, CI runs again and a fresh independent review follows. An episode
that makes no commit keeps the head (a correction of evidence, or a disputed
finding) and still goes through CI and a fresh review, never straight to merge.
An episode that is not accepted asks for another (with what it left and the new
findings) while the repair budget lasts; then the task fails with the unresolved
findings commented on the issue.
"""

from __future__ import annotations

import json

from aiworker.contracts.agent import Finding
from aiworker.core.evidence.acceptance import refusals
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.intake.standing import withdrawn_at_claim
from aiworker.core.phases.at_head import closed_by_person, gate_at, not_archived
from aiworker.core.phases.attempt_files import fetch_result_bundle
from aiworker.core.phases.continuation import continuation_json
from aiworker.core.phases.job import Job
from aiworker.core.phases.merged import merged
from aiworker.core.phases.model_run import (
    ModelRun,
    admit,
    run_model_phase,
    slot_base,
)
from aiworker.core.phases.outcome import Outcome
from aiworker.core.phases.prompts import repair_prompt
from aiworker.core.phases.reports import AttemptReport, ended
from aiworker.core.tasks.milestones import checks_of
from aiworker.core.tasks.repairs import RepairRequest, finding_lines, latest_request
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import Conflict
from aiworker.runtime.gitcache import AncestryRejected, GitCache


def repair(job: Job) -> Outcome:
    env, db, task, repo, slot = job.env, job.db, job.task, job.repo, job.slot or 0
    request = latest_request(db, task.id)
    if request is None:
        raise Conflict(f"task {task.id} is repairing but no repair was requested")
    report = AttemptReport(task.id, "running", base=request.base, head=request.start)
    job.report = report
    access = ForgeAccess(env.loaded)
    worker = access.required("worker")
    if job.pr is not None:  # a person may have closed or merged it since: nothing to repair
        pull = worker.pull(repo.owner, repo.name, job.pr)
        closed_by_person(task.id, pull)
        if pull.merged:
            return merged(job, pull, worker, ours=False)
    issue = worker.issue(repo.owner, repo.name, task.issue_number or 0)
    withdrawn = withdrawn_at_claim(env, access, repo, task, issue)
    if withdrawn:
        # Paused, it resumes repairing once authorised again; a milestone waits for its
        # plan (which poll pauses) without a slot.
        state = S.REPAIRING if task.kind == "milestone" else S.PAUSED
        return ended(report, state, "paused", withdrawn)
    forge_repo = worker.repository(repo.owner, repo.name)
    not_archived(task.id, forge_repo)
    cache = GitCache(env.state_dir)
    cache.fetch(repo.index, forge_repo.clone_url, access.token("worker"))
    admission = admit(env, db, "implementation")
    report.decisions = admission.decisions
    if admission.provider is None:
        # Back to waiting for a slot; nothing was spent.
        return ended(report, S.REPAIRING, "unavailable", "no provider is eligible for a repair now")
    cache.pin(repo.index, slot, "base", request.start)
    inputs = {
        "prompt.md": repair_prompt(issue, request.cause, finding_lines(request.findings)),
        "context.json": json.dumps(
            {
                "repository": f"{repo.owner}/{repo.name}",
                "issue": issue.number,
                "cause": request.cause,
                "start": request.start,
                "base": request.base,
                "conflicts": request.conflicts,
            }
        ),
        "continuation.json": continuation_json(
            job, cache, issue, request.base, head=request.start, findings=request.findings
        ),
    }
    recorded = {"cause": request.cause, "start": request.start, "base": request.base}
    run = run_model_phase(job, admission, slot_base(job, cache), inputs, recorded)
    report.provider, report.attempt = run.provider, run.attempt
    return _conclude(job, cache, request, issue.body, report, run)


def _conclude(
    job: Job,
    cache: GitCache,
    request: RepairRequest,
    body: str,
    report: AttemptReport,
    run: ModelRun,
) -> Outcome:
    env, db, repo, slot = job.env, job.db, job.repo, job.slot or 0
    assert job.backend is not None
    outcome_bundle = fetch_result_bundle(env, db, job.backend, job.task.id, run)
    head, refused = request.start, []
    # Work is taken from a success, and from a quota failure (the next episode goes on with it).
    if outcome_bundle is not None and run.failure in (None, "quota_exhausted"):
        try:
            head = cache.import_result(repo.index, slot, outcome_bundle, "refs/heads/work")
        except AncestryRejected as exc:
            refused.append(exc.message)
    if run.failure is not None or run.result is None:
        quota = run.failure == "quota_exhausted"
        again = _another(request, report, head, [], f"{run.failure}: {run.reason}")
        return again.ended(run.failure or "failed", run.reason, refunded=quota)
    if not cache.contains(repo.index, request.base, head):
        refused.append(f"the result does not contain the base {request.base[:12]}")
    marked = cache.with_markers(repo.index, head, request.conflicts)
    if marked:
        refused.append(f"conflict markers remain in {', '.join(marked)}")
    gate = gate_at(job, head, request.base, checks_of(db, job.task, body), claimed=run.result)
    report.head = head
    report.gate = {"passed": gate.passed, "checks": gate.checks, "findings": gate.findings}
    refused += gate.failures() + refusals(run.result)
    if refused:
        new = [Finding(severity="blocker", message=r[:20_000]) for r in refused]
        why = "the repair was not accepted: " + "; ".join(refused)
        return _another(request, report, head, new, why).ended("not_accepted", "; ".join(refused))
    reason = (
        f"repaired ({request.cause}) at {head[:12]}; every required check passed there"
        if head != request.start
        else f"no commit needed ({request.cause}): {run.result.summary}"[:1000]
    )
    report.outcome, report.reason = str(S.IMPLEMENTED), reason
    # A scope poll recorded meanwhile does not stop it: the work is kept, and publication
    # re-checks the scope itself.
    changes = {"head_commit": head, "base_commit": request.base}
    landing = Outcome(report, S.IMPLEMENTED, reason, changes, kind="repair.finished")
    return landing.ended("succeeded", f"repaired at {head[:12]}")


def _another(
    request: RepairRequest, report: AttemptReport, head: str, new: list[Finding], why: str
) -> Outcome:
    """Another episode from HEAD (what this one left), with the new findings first, while
    the repair budget lasts; else the task fails with the findings commented."""
    report.outcome, report.reason = "repairing", why[:1000]
    findings = [*new, *request.findings]
    following = RepairRequest(request.cause, head, request.base, findings, request.conflicts)
    return Outcome(report, repair=following, reason=why)
