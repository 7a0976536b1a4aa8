"""`aiworker implement --task ID --slot N`: one implementation attempt, start to receipt.

The driver (engine.py) moves the task claimed -> running; then, before any provider
runs, the base is pinned and the issue's inputs are checked (a problem there moves the
task to needs_input with a comment, spending nothing). A provider is chosen by
admission and run in a disposable workspace inside the phase guard; its result is
validated, its commits imported (they must descend from the base) and the quality gate
re-runs the checks (implement_verdict.py decides). The task's last move compares
against the version this phase set: if poll paused it or an operator cancelled it
meanwhile, that decision stands and the result is retained with the reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.models import Issue
from aiworker.core.context import Environment
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.intake.images import fetch_images
from aiworker.core.intake.scope import check_inputs, fingerprint, no_commits
from aiworker.core.intake.standing import withdrawn_at_claim
from aiworker.core.phases.at_head import not_archived
from aiworker.core.phases.attempt_files import fetch_result_bundle
from aiworker.core.phases.continuation import continuation_json
from aiworker.core.phases.implement_verdict import fell_back, judge, provider_failed, refused
from aiworker.core.phases.job import Job
from aiworker.core.phases.model_run import (
    Admission,
    admit,
    run_model_phase,
    slot_base,
)
from aiworker.core.phases.outcome import Outcome
from aiworker.core.phases.prompts import (
    implementation_context,
    implementation_prompt,
    milestone_prompt,
)
from aiworker.core.phases.reports import AttemptReport, ended, needs_input, stopped
from aiworker.core.providers.registry import one_try_per_snapshot
from aiworker.core.tasks.milestones import checks_of, milestone_of
from aiworker.core.tasks.states import TaskState as S
from aiworker.runtime.gitcache import AncestryRejected, GitCache
from aiworker.store.attempts import providers_tried_at
from aiworker.store.engine import Database
from aiworker.store.models import Task

log = logging.getLogger(__name__)


@dataclass
class Ready:
    """Everything the provider's run starts from, once nothing stops it."""

    report: AttemptReport
    worker: ForgejoClient
    issue: Issue
    parent: Task | None
    cache: GitCache
    base: str
    admission: Admission
    simple: bool


def implement(job: Job) -> Outcome:
    ready = _ready(job)
    if isinstance(ready, Outcome):
        return ready
    return _run(job, ready)


def _ready(job: Job) -> Ready | Outcome:
    """Pin the base, check the issue's inputs and choose a provider; how the phase ends
    instead when any of that stops it (nothing is spent)."""
    env, db, task, repo, slot = job.env, job.db, job.task, job.repo, job.slot
    name = job.phase.name
    access = ForgeAccess(env.loaded)
    worker = access.required("worker")
    parent = _plan_of(db, task)
    issue = worker.issue(repo.owner, repo.name, (parent or task).issue_number or 0)
    forge_repo = worker.repository(repo.owner, repo.name)
    not_archived(task.id, forge_repo)
    cache = GitCache(env.state_dir)
    branches = cache.fetch(repo.index, forge_repo.clone_url, access.token("worker"))
    if parent is None and forge_repo.default_branch not in branches:
        report = job.report = AttemptReport(task.id, "running")
        return needs_input(report, [no_commits(forge_repo.default_branch)])
    # A milestone starts where its plan's branch is: after the milestones before it.
    start = (
        parent.head_commit or parent.base_commit
        if parent is not None
        else f"refs/remotes/origin/{forge_repo.default_branch}"
    )
    base = cache.pin(repo.index, slot or 0, "base", start or "")
    report = AttemptReport(task.id, "running", base=base)
    job.report = report
    problems = check_inputs(issue, cache, repo.index, base)
    if problems:
        return needs_input(report, problems)
    withdrawn = withdrawn_at_claim(env, access, repo, task, issue)
    wait = _not_now(env, task, parent, issue)
    if withdrawn or wait:
        # Withdrawn: paused until a writer authorises it again (a milestone waits for its
        # plan, which poll pauses); else it waits, ready.
        paused = withdrawn and task.kind != "milestone"
        state, why = (S.PAUSED, withdrawn) if paused else (S.READY, withdrawn or wait)
        return ended(report, state, str(state), why or "")
    simple = (
        milestone_of(task).simple
        if parent is not None
        else env.loaded.config.labels.simple in issue.label_names
    )
    with db.read() as session:
        tried = providers_tried_at(session, task.id, base)
    admission = admit(env, db, name, simple=simple, tried_here=tried)
    report.decisions = admission.decisions
    if admission.provider is None:
        reason = "no provider is eligible for implementation now" + (
            "; inference is suspended" if admission.suspended else ""
        )
        return ended(report, S.READY, "unavailable", reason)
    gone = stopped(job, report)
    if gone is not None:
        return gone
    return Ready(report, worker, issue, parent, cache, base, admission, simple)


def _run(job: Job, ready: Ready) -> Outcome:
    """Run the provider, import its commits and judge the result."""
    env, db, task, repo, slot = job.env, job.db, job.task, job.repo, job.slot
    report, issue, cache, base, simple = (
        ready.report,
        ready.issue,
        ready.cache,
        ready.base,
        ready.simple,
    )
    parent = ready.parent
    images = fetch_images(ready.worker, issue)
    inputs: dict[str, str | bytes] = {
        "prompt.md": _prompt(task, issue),
        "context.json": implementation_context(
            repo, issue.number, base, images, task if parent is not None else None
        ),
        "continuation.json": continuation_json(job, cache, issue, base),
        **images.files,
    }
    run = run_model_phase(
        job, ready.admission, slot_base(job, cache), inputs, {"base": base, "simple": simple}
    )
    report.provider, report.attempt = run.provider, run.attempt
    assert job.backend is not None
    outcome_bundle = fetch_result_bundle(env, db, job.backend, task.id, run)
    # A local model has one try at this snapshot: whatever fails, the next provider goes on.
    local = one_try_per_snapshot(env, run.provider)
    if run.failure is not None:
        if local:
            return fell_back(job, report, run.failure, run.reason, simple=simple)
        return provider_failed(job, cache, report, run, outcome_bundle)
    if outcome_bundle is None:
        return refused(job, report, "failed", "the agent made no commits", local, simple)
    try:
        report.head = cache.import_result(repo.index, slot or 0, outcome_bundle, "refs/heads/work")
    except AncestryRejected as exc:
        return refused(job, report, "failed", exc.message, local, simple)
    assert run.result is not None
    requirements = checks_of(db, task, issue.body)
    return judge(job, requirements, report, run.result, local=local, simple=simple)


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
