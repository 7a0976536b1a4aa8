"""`aiworker implement --task ID --slot N`: one implementation attempt, start to receipt.

The task moves claimed -> running; then, before any provider runs, the base is
pinned and the issue's inputs are checked (a problem there moves the task to
needs_input with a comment, spending nothing) and the budget is read. A provider
is chosen by admission and run in a disposable workspace inside the phase guard;
its result is validated, its commits imported (they must descend from the base)
and the quality gate re-runs the checks. The task's last move compares against
the version this phase set: if poll paused it or an operator cancelled it
meanwhile, that decision stands and the result is retained with the reason.
"""

from __future__ import annotations

import logging

from aiworker.adapters.forgejo.models import Issue
from aiworker.core.context import Environment
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.guests.backends import backend_for
from aiworker.core.intake.images import fetch_images
from aiworker.core.intake.scope import Requirement, check_inputs, fingerprint
from aiworker.core.intake.standing import withdrawn_at_claim
from aiworker.core.phases.attempt_files import fetch_result_bundle
from aiworker.core.phases.continuation import continuation_json
from aiworker.core.phases.engine import ModelRun, admit, run_model_phase, workspaces_dir
from aiworker.core.phases.guard import PhaseGuard
from aiworker.core.phases.implement_outcomes import (
    ImplementReport,
    Running,
    ended,
    failed,
    fell_back,
    needs_input,
    still_ours,
    stopped,
)
from aiworker.core.phases.implement_verdict import judge, provider_failed
from aiworker.core.phases.prompts import (
    implementation_context,
    implementation_prompt,
    milestone_prompt,
)
from aiworker.core.phases.slot_start import load_on_slot, take_up
from aiworker.core.providers.registry import one_try_per_snapshot
from aiworker.core.scheduling.launcher import follow_up_if_asked
from aiworker.core.tasks.budgets import budget_spent, land_after_failure
from aiworker.core.tasks.milestones import checks_of, milestone_of
from aiworker.core.tasks.states import TaskState as S
from aiworker.runtime.gitcache import AncestryRejected, GitCache
from aiworker.store.attempts import providers_tried_at
from aiworker.store.engine import Database
from aiworker.store.models import Task

log = logging.getLogger(__name__)
PHASE = "implementation"


def implement(env: Environment, task_id: int, slot: int) -> ImplementReport:
    db = env.open_database()
    try:
        task, repo = load_on_slot(db, task_id, slot, S.CLAIMED, "claimed")
        started = take_up(
            env, db, task, repo, slot, S.RUNNING, f"implementing on slot {slot}", "implement"
        )
        lock = started.lock
        running = Running(task, repo, slot, started.version, started.token)

        def recover(reason: str) -> None:
            land_after_failure(
                env, db, task.id, S.RUNNING, running.version, PHASE, reason, retry_state=S.READY
            )

        with PhaseGuard(db, task.id, PHASE, recover, backend_for(env, PHASE), lock) as guard:
            report = _implement(env, db, guard, running)
        if report.outcome != "unavailable":
            follow_up_if_asked(env)
        return report
    finally:
        db.dispose()


def _implement(
    env: Environment, db: Database, guard: PhaseGuard, running: Running
) -> ImplementReport:
    task, repo, slot = running.task, running.repo, running.slot
    access = ForgeAccess(env.loaded)
    worker = access.required("worker")
    parent = _plan_of(db, task)
    issue = worker.issue(repo.owner, repo.name, (parent or task).issue_number or 0)
    forge_repo = worker.repository(repo.owner, repo.name)
    cache = GitCache(env.state_dir)
    cache.fetch(repo.index, forge_repo.clone_url, access.token("worker"))
    # A milestone starts where its plan's branch is: after the milestones before it.
    start = (
        parent.head_commit or parent.base_commit
        if parent is not None
        else f"refs/remotes/origin/{forge_repo.default_branch}"
    )
    base = cache.pin(repo.index, slot, "base", start or "")
    report = ImplementReport(task.id, "running", base=base)
    problems = check_inputs(issue, cache, repo.index, base)
    if problems:
        return needs_input(env, db, running, report, problems)
    withdrawn = withdrawn_at_claim(env, access, repo, task, issue)
    wait = _not_now(env, task, parent, issue)
    if withdrawn or wait:
        # Withdrawn: paused until a writer authorises it again (a milestone waits for its
        # plan, which poll pauses); else it waits, ready.
        paused = withdrawn and task.kind != "milestone"
        state, why = (S.PAUSED, withdrawn) if paused else (S.READY, withdrawn or wait)
        return ended(db, running, report, state, str(state), why or "")
    exhausted = budget_spent(env, db, task.id, PHASE)
    if exhausted:
        guard.recover(exhausted)
        report.outcome, report.reason, report.state = "failed", "budget spent", S.FAILED
        return report
    simple = (
        milestone_of(task).simple
        if parent is not None
        else env.loaded.config.labels.simple in issue.label_names
    )
    with db.read() as session:
        tried = providers_tried_at(session, task.id, base)
    admission = admit(env, db, PHASE, simple=simple, tried_here=tried)
    report.decisions = admission.decisions
    if admission.provider is None:
        reason = "no provider is eligible for implementation now" + (
            "; inference is suspended" if admission.suspended else ""
        )
        return ended(db, running, report, S.READY, "unavailable", reason)
    if not still_ours(db, running):
        return stopped(db, running, report)
    images = fetch_images(worker, issue)
    bundle = cache.bundle_out(
        repo.index, slot, workspaces_dir(env) / f"task-{task.id}-{PHASE}.bundle"
    )
    run = run_model_phase(
        env,
        db,
        guard,
        admission,
        bundle=bundle,
        ref=f"refs/aiworker/slot-{slot}/base",
        inputs={
            "prompt.md": _prompt(task, issue),
            "context.json": implementation_context(
                repo, issue.number, base, images, task if parent is not None else None
            ),
            "continuation.json": continuation_json(
                db,
                cache,
                task=task,
                repo=repo,
                phase=PHASE,
                issue=issue,
                base=base,
            ),
            **images.files,
        },
        recorded={"base": base, "simple": simple},
    )
    report.provider, report.attempt = run.provider, run.attempt
    requirements = checks_of(db, task, issue.body)
    return _conclude(env, db, guard, running, cache, requirements, report, run, simple=simple)


def _not_now(env: Environment, task: Task, parent: Task | None, issue: Issue) -> str | None:
    """Why the task must wait instead of running now (nothing is spent), or None."""
    scope = fingerprint(issue, env.loaded.config.labels.approved)
    if parent is not None:
        if parent.state != S.MILESTONES:
            return f"its plan is {parent.state}; the milestone waits for it"
        if (parent.spec or {}).get("approved", {}).get("fingerprint") != scope:
            return "the issue changed after its plan was approved; the plan waits for approval"
    elif scope != task.scope_fingerprint:
        return "the issue changed since it was scoped; the next poll records the new scope"
    return None


def _prompt(task: Task, issue: Issue) -> str:
    if task.kind != "milestone":
        return implementation_prompt(issue)
    spec = task.spec or {}
    return milestone_prompt(issue, milestone_of(task), spec["position"], spec["total"])


def _plan_of(db: Database, task: Task) -> Task | None:
    """A milestone's plan (None for any other task)."""
    if task.kind != "milestone" or task.parent_id is None:
        return None
    with db.read() as session:
        return session.get(Task, task.parent_id)


def _conclude(
    env: Environment,
    db: Database,
    guard: PhaseGuard,
    running: Running,
    cache: GitCache,
    requirements: list[Requirement],
    report: ImplementReport,
    run: ModelRun,
    *,
    simple: bool,
) -> ImplementReport:
    repo, slot = running.repo, running.slot
    assert guard.backend is not None
    outcome_bundle = fetch_result_bundle(env, db, guard.backend, guard.task_id, run)
    # A local model has one try at this snapshot: whatever fails, the next provider goes on.
    local = one_try_per_snapshot(env, run.provider)

    def refuse(outcome: str, reason: str) -> ImplementReport:
        if local:
            return fell_back(env, db, guard, running, report, outcome, reason, simple=simple)
        return failed(db, guard, running, report, reason)

    if run.failure is not None:
        if local:
            return refuse(run.failure, run.reason)
        return provider_failed(env, db, guard, running, cache, report, run, outcome_bundle)
    if outcome_bundle is None:
        return refuse("failed", "the agent made no commits")
    try:
        report.head = cache.import_result(repo.index, slot, outcome_bundle, "refs/heads/work")
    except AncestryRejected as exc:
        return refuse("failed", exc.message)
    assert run.result is not None
    return judge(env, db, guard, running, requirements, report, run.result, refuse, local=local)
