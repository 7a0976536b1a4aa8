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
from aiworker.core.context import Environment
from aiworker.core.evidence.acceptance import refusals
from aiworker.core.evidence.gate import run_checks
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.guests.backends import backend_for
from aiworker.core.intake.standing import withdrawn_at_claim
from aiworker.core.phases.attempt_files import fetch_result_bundle
from aiworker.core.phases.continuation import continuation_json
from aiworker.core.phases.engine import ModelRun, admit, run_model_phase, workspaces_dir
from aiworker.core.phases.guard import PhaseGuard
from aiworker.core.phases.implement_outcomes import (
    ImplementReport,
    Running,
    retained,
    stopped,
)
from aiworker.core.phases.prompts import repair_prompt
from aiworker.core.phases.slot_start import load_on_slot, take_up
from aiworker.core.runner.dispatch import Dispatch
from aiworker.core.scheduling.launcher import follow_up_if_asked
from aiworker.core.tasks.budgets import RELEASE
from aiworker.core.tasks.lifecycle import TransitionRefused, advance
from aiworker.core.tasks.milestones import checks_of
from aiworker.core.tasks.repairs import (
    PHASE,
    RepairRequest,
    finding_lines,
    latest_request,
    request_repair,
)
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import Conflict
from aiworker.runtime.gitcache import AncestryRejected, GitCache
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task


def _load(db: Database, task_id: int, slot: int) -> tuple[Task, Repository, RepairRequest]:
    task, repo = load_on_slot(db, task_id, slot, S.REPAIRING, "repairing")
    request = latest_request(db, task_id)
    if request is None:
        raise Conflict(f"task {task_id} is repairing but no repair was requested")
    return task, repo, request


def repair(env: Environment, task_id: int, slot: int) -> ImplementReport:
    db = env.open_database()
    try:
        task, repo, request = _load(db, task_id, slot)
        why = f"repairing ({request.cause}) on slot {slot}"
        started = take_up(env, db, task, repo, slot, S.REPAIRING, why, PHASE)
        lock = started.lock
        running = Running(task, repo, slot, started.version, started.token, S.REPAIRING)

        def recover(reason: str) -> None:
            again(env, db, running, request, request.start, [], reason)

        with PhaseGuard(db, task.id, PHASE, recover, backend_for(env, PHASE), lock) as guard:
            report = _repair(env, db, guard, running, request)
        if report.outcome != "unavailable":
            follow_up_if_asked(env)
        return report
    finally:
        db.dispose()


def again(
    env: Environment,
    db: Database,
    running: Running,
    request: RepairRequest,
    start: str,
    new: list[Finding],
    why: str,
) -> str:
    """Another episode from START (what this one left) while the budget lasts, else failed
    with the findings commented."""
    task = running.task
    task.version = running.version
    findings = [*new, *request.findings]
    following = RepairRequest(request.cause, start, request.base, findings, request.conflicts)
    try:
        return request_repair(env, db, task, S.REPAIRING, following, why)
    except TransitionRefused as exc:
        # Paused or cancelled meanwhile: that decision stands; what was made stays in the cache.
        return exc.refusal.actual_state or "gone"


def _repair(
    env: Environment, db: Database, guard: PhaseGuard, running: Running, request: RepairRequest
) -> ImplementReport:
    task, repo, slot = running.task, running.repo, running.slot
    report = ImplementReport(task.id, "running", base=request.base, head=request.start)
    access = ForgeAccess(env.loaded)
    worker = access.required("worker")
    issue = worker.issue(repo.owner, repo.name, task.issue_number or 0)
    withdrawn = withdrawn_at_claim(env, access, repo, task, issue)
    if withdrawn:
        # Paused, it resumes repairing once authorised again; a milestone waits for its
        # plan (which poll pauses) without a slot.
        state = S.REPAIRING if task.kind == "milestone" else S.PAUSED
        if not _land(db, running, state, withdrawn):
            return stopped(db, running, report)
        report.outcome, report.reason, report.state = "paused", withdrawn, state
        return report
    cache = GitCache(env.state_dir)
    cache.fetch(
        repo.index, worker.repository(repo.owner, repo.name).clone_url, access.token("worker")
    )
    admission = admit(env, db, "implementation")
    report.decisions = admission.decisions
    if admission.provider is None:
        reason = "no provider is eligible for a repair now"
        _land(db, running, S.REPAIRING, reason)  # back to waiting for a slot; nothing spent
        report.outcome, report.reason, report.state = "unavailable", reason, S.REPAIRING
        return report
    cache.pin(repo.index, slot, "base", request.start)
    bundle = cache.bundle_out(
        repo.index, slot, workspaces_dir(env) / f"task-{task.id}-repair.bundle"
    )
    run = run_model_phase(
        env,
        db,
        guard,
        admission,
        bundle=bundle,
        ref=f"refs/aiworker/slot-{slot}/base",
        inputs={
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
                db,
                cache,
                task=task,
                repo=repo,
                phase=PHASE,
                issue=issue,
                base=request.base,
                head=request.start,
                findings=request.findings,
            ),
        },
        recorded={"cause": request.cause, "start": request.start, "base": request.base},
    )
    report.provider, report.attempt = run.provider, run.attempt
    return _conclude(env, db, guard, running, cache, request, issue.body, report, run)


def _conclude(
    env: Environment,
    db: Database,
    guard: PhaseGuard,
    running: Running,
    cache: GitCache,
    request: RepairRequest,
    body: str,
    report: ImplementReport,
    run: ModelRun,
) -> ImplementReport:
    repo, slot = running.repo, running.slot
    assert guard.backend is not None
    outcome_bundle = fetch_result_bundle(env, db, guard.backend, guard.task_id, run)
    head, refused = request.start, []
    # Work is taken from a success, and from a quota failure (the next episode goes on with it).
    if outcome_bundle is not None and run.failure in (None, "quota_exhausted"):
        try:
            head = cache.import_result(repo.index, slot, outcome_bundle, "refs/heads/work")
        except AncestryRejected as exc:
            refused.append(exc.message)
    if run.failure is not None or run.result is None:
        guard.finish(run.failure or "failed", run.reason, refunded=run.failure == "quota_exhausted")
        return _another(env, db, running, request, report, head, [], f"{run.failure}: {run.reason}")
    if not cache.contains(repo.index, request.base, head):
        refused.append(f"the result does not contain the base {request.base[:12]}")
    marked = cache.with_markers(repo.index, head, request.conflicts)
    if marked:
        refused.append(f"conflict markers remain in {', '.join(marked)}")
    gate = run_checks(
        db,
        Dispatch.of(env, db),
        index=repo.index,
        head=head,
        base=request.base,
        task_id=running.task.id,
        scope=running.task.scope_fingerprint,
        requirements=checks_of(db, running.task, body),
        claimed=run.result,
    )
    report.head = head
    report.gate = {"passed": gate.passed, "checks": gate.checks, "findings": gate.findings}
    refused += gate.failures() + refusals(run.result)
    if refused:
        guard.finish("not_accepted", "; ".join(refused)[:1000])
        new = [Finding(severity="blocker", message=r[:20_000]) for r in refused]
        why = "the repair was not accepted: " + "; ".join(refused)
        return _another(env, db, running, request, report, head, new, why)
    guard.finish("succeeded", f"repaired at {head[:12]}")
    reason = (
        f"repaired ({request.cause}) at {head[:12]}; every required check passed there"
        if head != request.start
        else f"no commit needed ({request.cause}): {run.result.summary}"[:1000]
    )
    if not _land(db, running, S.IMPLEMENTED, reason, head_commit=head, base_commit=request.base):
        return retained(db, guard, running, report)
    report.outcome, report.reason, report.state = str(S.IMPLEMENTED), reason, S.IMPLEMENTED
    return report


def _land(db: Database, running: Running, to_state: str, reason: str, **changes: str) -> bool:
    """The episode's last move, releasing the slot; False when the task moved on meanwhile
    (paused, cancelled): that decision stands. A scope poll recorded meanwhile does not
    stop it: the work is kept, and publication re-checks the scope itself."""
    try:
        with db.write() as session:
            running.version = advance(
                session,
                running.task.id,
                S.REPAIRING,
                running.version,
                to_state,
                reason,
                actor=PHASE,
                kind="repair.finished" if to_state == S.IMPLEMENTED else "task.transition",
                follow_data_changes=True,
                **{**RELEASE, **changes},
            )
    except TransitionRefused:
        return False
    return True


def _another(
    env: Environment,
    db: Database,
    running: Running,
    request: RepairRequest,
    report: ImplementReport,
    head: str,
    new: list[Finding],
    why: str,
) -> ImplementReport:
    report.reason = why[:1000]
    report.state = again(env, db, running, request, head, new, why)
    report.outcome = "failed" if report.state == S.FAILED else "repairing"
    return report
