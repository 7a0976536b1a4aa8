"""`aiworker implement --task ID --slot N`: one implementation attempt, start to receipt.

Pin the base in the git cache, prepare a workspace, choose a provider by
admission, run the phase with a deadline and a private home, validate the
result document, import the result bundle (it must descend from the base), and
let the quality gate re-run the checks and write receipts. A quota failure
keeps the work, refunds the attempt and hands the task back so the next tick
can choose another provider.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from aiworker.contracts.agent import AgentResult
from aiworker.core.context import Environment
from aiworker.core.evidence.gate import requirements_from_issue, run_gate
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.phases.run import RunReport, run_provider
from aiworker.core.providers.admission import provider_settings, select_provider
from aiworker.core.providers.registry import (
    backoffs,
    capability_check,
    observe,
    provider_for,
    read_provider,
)
from aiworker.errors import Conflict, InvalidInput, Unavailable
from aiworker.runtime.gitcache import AncestryRejected, GitCache
from aiworker.runtime.workspace import LocalBackend
from aiworker.store.attempts import finish_attempt, providers_tried_at, start_attempt
from aiworker.store.models import Repository, Task
from aiworker.store.observations import record_run, running_jobs
from aiworker.store.tasks import append_event, transition

log = logging.getLogger(__name__)
BACKEND = LocalBackend()
PHASE = "implementation"
# Failures after which another try (maybe another provider) may succeed.
RETRYABLE = ("quota_exhausted", "transient", "auth", "over_budget")


@dataclass
class ImplementReport:
    task: int
    outcome: str
    provider: str | None = None
    attempt: int | None = None
    base: str | None = None
    head: str | None = None
    gate: dict[str, Any] | None = None
    reason: str = ""
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _load(db: Any, task_id: int, slot: int) -> tuple[Task, Repository]:
    with db.read() as session:
        task = session.get(Task, task_id)
        if task is None:
            raise InvalidInput(f"no task {task_id}")
        repo = session.get(Repository, task.repository_id)
        assert repo is not None
    if task.state != "claimed" or task.claim_slot != slot:
        raise Conflict(
            f"task {task_id} is {task.state} on slot {task.claim_slot}, not claimed on slot {slot}"
        )
    return task, repo


def _move(db: Any, task: Task, to_state: str, reason: str, **changes: Any) -> None:
    with db.write() as session:
        current = session.get(Task, task.id)
        assert current is not None
        if not transition(
            session,
            task.id,
            current.version,
            current.state,
            to_state,
            actor="implement",
            data={"reason": reason},
            **changes,
        ):
            raise Conflict(f"task {task.id} changed while implementing; stopping")


def implement(env: Environment, task_id: int, slot: int) -> ImplementReport:
    config = env.loaded.config
    db = env.open_database()
    try:
        task, repo = _load(db, task_id, slot)
        _move(db, task, "running", f"implementing on slot {slot}")
        release = {"claim_slot": None, "claim_token": None, "claimed_at": None}
        access = ForgeAccess(env.loaded)
        worker = access.required("worker")
        issue = worker.issue(repo.owner, repo.name, task.issue_number or 0)
        forge_repo = worker.repository(repo.owner, repo.name)
        cache = GitCache(env.state_dir)
        cache.fetch(repo.index, forge_repo.clone_url, access.token("worker"))
        base = cache.pin(
            repo.index, slot, "base", f"refs/remotes/origin/{forge_repo.default_branch}"
        )
        simple = config.labels.simple in issue.label_names
        now = datetime.now(UTC)
        with db.read() as session:
            running = running_jobs(session)
            backoff = backoffs(session, config.providers)
            tried = providers_tried_at(session, task.id, base)
        selection = select_provider(
            config,
            PHASE,
            lambda n: read_provider(env, n, now),
            running,
            now,
            simple=simple,
            backoff=backoff,
            capable=capability_check(env, PHASE, simple=simple, tried_here=tried),
        )
        observe(db, selection.decisions)
        decisions = [
            {"provider": d.provider, "eligible": d.eligible, "reason": d.reason}
            for d in selection.decisions
        ]
        if selection.provider is None:
            _move(db, task, "ready", "no provider is eligible now", **release)
            raise Unavailable(
                "no provider is eligible for implementation now"
                + ("; inference is suspended" if selection.suspended else "")
            )
        name = selection.provider
        settings = provider_settings(config, PHASE, name, simple=simple)
        model = settings.model if settings else None
        effort = settings.effort if settings else None
        with db.write() as session:
            attempt_id = start_attempt(
                session,
                task.id,
                PHASE,
                name,
                model,
                effort,
                {**(settings.model_dump() if settings else {}), "base": base, "simple": simple},
            )
            append_event(
                session,
                "attempt.started",
                task_id=task.id,
                actor=name,
                data={"attempt": attempt_id, "phase": PHASE, "base": base},
            )
        report = ImplementReport(task.id, "running", name, attempt_id, base, decisions=decisions)
        workspaces = env.state_dir / "workspaces"
        workspaces.mkdir(mode=0o700, exist_ok=True)
        root = workspaces / f"task-{task.id}-attempt-{attempt_id}"
        bundle = cache.bundle_out(
            repo.index,
            slot,
            env.state_dir / "workspaces" / f"task-{task.id}-attempt-{attempt_id}.bundle",
        )
        prompt = (
            f"# {issue.title}\n\n{issue.body}\n\nWork on branch `work`; commit your "
            "changes; finish with the result document.\n"
        )
        schema = json.dumps(AgentResult.model_json_schema())
        workspace = BACKEND.prepare(
            root,
            bundle,
            f"refs/aiworker/slot-{slot}/base",
            {
                "prompt.md": prompt,
                "result-schema.json": schema,
                "context.json": json.dumps(
                    {"repository": f"{repo.owner}/{repo.name}", "issue": issue.number, "base": base}
                ),
                "settings.json": json.dumps({"provider": name, "model": model, "effort": effort}),
            },
        )
        bundle.unlink(missing_ok=True)
        run = run_provider(
            provider_for(env, name), workspace, model, effort, attempt_id, backend=BACKEND
        )
        return _conclude(db, cache, task, repo, slot, issue.body, report, workspace, run, release)
    finally:
        db.dispose()


def _conclude(
    db: Any,
    cache: GitCache,
    task: Task,
    repo: Repository,
    slot: int,
    body: str,
    report: ImplementReport,
    workspace: Any,
    run: RunReport,
    release: dict[str, Any],
) -> ImplementReport:
    assert report.attempt is not None
    assert report.provider is not None
    outcome_bundle = BACKEND.result_bundle(workspace, workspace.root / "result.bundle")
    if run.failure is not None:
        quota = run.failure == "quota_exhausted"
        with db.write() as session:
            finish_attempt(session, report.attempt, run.failure, refunded=quota)
            record_run(session, report.provider, run.failure, run.reason)
        if quota and outcome_bundle is not None:
            report.head = cache.import_result(repo.index, slot, outcome_bundle, "refs/heads/work")
        BACKEND.teardown(workspace, preserve=quota)
        _move(
            db,
            task,
            "ready" if run.failure in RETRYABLE else "failed",
            f"{run.failure}: {run.reason}",
            **release,
        )
        report.outcome, report.reason = run.failure, run.reason
        return report
    try:
        result = AgentResult.model_validate(run.result)
    except ValidationError as exc:
        first = exc.errors(include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        return _fail(
            db,
            task,
            report,
            workspace,
            release,
            f"malformed result document: {where}: {first['msg']}",
        )
    if outcome_bundle is None:
        return _fail(db, task, report, workspace, release, "the agent made no commits")
    try:
        report.head = cache.import_result(repo.index, slot, outcome_bundle, "refs/heads/work")
    except AncestryRejected as exc:
        return _fail(db, task, report, workspace, release, exc.message)
    gate = run_gate(
        db,
        cache,
        index=repo.index,
        slot=slot,
        task_id=task.id,
        scope=task.scope_fingerprint,
        requirements=requirements_from_issue(body),
        claimed=result,
    )
    report.gate = {"passed": gate.passed, "checks": gate.checks, "findings": gate.findings}
    with db.write() as session:
        finish_attempt(session, report.attempt, "succeeded" if gate.passed else "gate_failed")
        record_run(session, report.provider, "ok", "")
    BACKEND.teardown(workspace, preserve=False)
    state = "implemented" if gate.passed and result.completion == "complete" else "failed"
    _move(
        db,
        task,
        state,
        "quality gate passed"
        if state == "implemented"
        else "quality gate failed or the agent did not complete",
        base_commit=report.base,
        head_commit=report.head,
        **release,
    )
    report.outcome = state
    return report


def _fail(
    db: Any,
    task: Task,
    report: ImplementReport,
    workspace: Any,
    release: dict[str, Any],
    reason: str,
) -> ImplementReport:
    assert report.attempt is not None
    with db.write() as session:
        finish_attempt(session, report.attempt, "failed")
    BACKEND.teardown(workspace, preserve=False)
    _move(db, task, "failed", reason, **release)
    report.outcome, report.reason = "failed", reason
    log.warning("task %d: %s", task.id, reason)
    return report
