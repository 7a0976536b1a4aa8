"""What the model phases (plan, implement, repair, review) share: admission, the attempt
record, the workspace, the run, result validation.

Each step runs inside the job's guard (job.py), so an exception anywhere closes the
attempt and lands the task; the phase module only decides what a valid result
means for its task.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from aiworker.contracts.agent import AgentResult
from aiworker.core.context import Environment
from aiworker.core.guests.backends import host_secrets, provider_homes
from aiworker.core.phases.attempt_files import keep_attempt_files
from aiworker.core.phases.job import Job
from aiworker.core.phases.local_route import LocalRoute, route_outcome
from aiworker.core.phases.run import RunReport, run_provider
from aiworker.core.providers.admission import provider_settings, select_provider
from aiworker.core.providers.registry import (
    backoffs,
    capability_check,
    observe,
    provider_for,
    read_provider,
)
from aiworker.core.tasks.deadlines import run_limit_s
from aiworker.runtime.attempts import default_attempt_root, ensure_private_root
from aiworker.runtime.failpoints import failpoint
from aiworker.runtime.gitcache import GitCache
from aiworker.runtime.workspace import Workspace
from aiworker.store.engine import Database
from aiworker.store.observations import record_run, running_jobs

log = logging.getLogger(__name__)


@dataclass
class Admission:
    provider: str | None
    model: str | None = None
    effort: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    suspended: bool = False


@dataclass
class ModelRun:
    provider: str
    attempt: int
    workspace: Workspace
    result: AgentResult | None
    failure: str | None  # the provider's failure class, or "invalid" for a bad document
    reason: str


def admit(
    env: Environment,
    db: Database,
    phase: str,
    *,
    simple: bool = False,
    tried_here: set[str] | None = None,
) -> Admission:
    """Choose a provider for PHASE by quota admission; every decision is recorded."""
    config = env.loaded.config
    now = datetime.now(UTC)
    with db.read() as session:
        running = running_jobs(session)
        backoff = backoffs(session, config.providers)
    selection = select_provider(
        config,
        phase,
        lambda n: read_provider(env, n, now),
        running,
        now,
        simple=simple,
        backoff=backoff,
        capable=capability_check(env, phase, simple=simple, tried_here=tried_here or ()),
    )
    observe(db, selection.decisions)
    decisions = [
        {"provider": d.provider, "eligible": d.eligible, "reason": d.reason}
        for d in selection.decisions
    ]
    if selection.provider is None:
        return Admission(None, decisions=decisions, suspended=selection.suspended)
    settings = provider_settings(config, phase, selection.provider, simple=simple)
    return Admission(
        selection.provider,
        settings.model if settings else None,
        settings.effort if settings else None,
        settings.model_dump() if settings else {},
        decisions,
    )


def slot_base(job: Job, cache: GitCache) -> tuple[Path, str]:
    """The slot's pinned base, bundled for the phase's workspace, and the ref it is at."""
    slot = job.slot or 0
    path = workspaces_dir(job.env) / f"task-{job.task.id}-{job.phase.name}.bundle"
    return cache.bundle_out(job.repo.index, slot, path), f"refs/aiworker/slot-{slot}/base"


def run_model_phase(
    job: Job,
    admission: Admission,
    source: tuple[Path, str],
    inputs: Mapping[str, str | bytes],
    recorded: dict[str, Any],
    *,
    read_only: bool = False,
) -> ModelRun:
    """Start the attempt, prepare the workspace from SOURCE (a bundle, and the ref to check
    out) with INPUTS, run the provider and validate its result document. RECORDED joins
    the attempt's settings. READ_ONLY (review, planning): the checkout is a detached head
    the job cannot change, and a result from a job that changed it anyway is not accepted."""
    env, db, phase = job.env, job.db, job.phase.name
    bundle, ref = source
    name = admission.provider
    assert name is not None
    backend = job.backend
    assert backend is not None
    # The attempt says where it ran: the backend and, for a guest, its accelerator and image.
    attempt = job.start(
        name,
        {**admission.settings, **recorded, **backend.describe()},
        admission.model,
        admission.effort,
    )
    inputs = {
        **inputs,
        "result-schema.json": json.dumps(AgentResult.model_json_schema()),
        "settings.json": json.dumps(
            {"provider": name, "model": admission.model, "effort": admission.effort}
        ),
    }
    root = workspaces_dir(env) / f"task-{job.task.id}-{phase}-{attempt}"
    provider = provider_for(env, name)
    route = None
    try:
        try:
            # Never past the task's deadline, nor the phase's own limit (tasks/deadlines.py).
            limit_s = run_limit_s(env, db, job.task.id, phase)
            # A local model is reached only through the gate that bounds its try.
            route = LocalRoute.open(provider, backend)
            workspace = job.track(backend.prepare(root, bundle, ref, inputs, read_only=read_only))
        finally:
            bundle.unlink(missing_ok=True)
        job.spent = True
        if route is not None:
            route.gate.begin()
        run = run_provider(
            route.provider if route else provider,
            workspace,
            admission.model,
            admission.effort,
            env.attempt_tag(phase, attempt),
            phase,
            backend=backend,
            # The embedded runner's attempts too: other repositories' checks run there (made
            # now if missing: the jail hides only what exists when it is built).
            hidden=[
                *provider_homes(env),
                *host_secrets(env),
                ensure_private_root(default_attempt_root()),
            ],
            bound=route.bound if route else None,
            timeout_s=limit_s,
        )
    finally:
        used = route.close() if route else None
    if route is not None and used is not None:
        run = route_outcome(db, attempt, run, used, route.bound.seconds)
    failpoint(f"{phase}.after_run")
    _keep_files(job, attempt, inputs, run)
    result, failure, reason = _validated(run)
    changed = backend.altered(workspace) if read_only and failure is None else []
    if changed:
        result, failure = None, "invalid"
        reason = f"the {phase} changed the checkout it must leave as it was: " + ", ".join(
            changed[:10]
        )
    with db.write() as session:
        record_run(session, name, "ok" if failure is None else failure, reason)
    return ModelRun(name, attempt, workspace, result, failure, reason)


def _keep_files(job: Job, attempt: int, inputs: dict[str, str | bytes], run: RunReport) -> None:
    """The attempt's prompt, result and provider output, and what it was handed (its
    continuation and context documents, the issue's images), for the operator; a file
    system or a database that refuses them costs the operator that view, never the
    attempt's result."""
    prompt = inputs.get("prompt.md", "")
    text = prompt if isinstance(prompt, str) else prompt.decode(errors="replace")
    handed = {name: data for name, data in inputs.items() if name != "prompt.md"}
    try:
        keep_attempt_files(job.env, job.db, job.task.id, attempt, text, run, handed)
    except Exception as exc:
        log.warning("task %d: the attempt's files were not kept: %s", job.task.id, exc)


def _validated(run: RunReport) -> tuple[AgentResult | None, str | None, str]:
    if run.failure is not None:
        return None, run.failure, run.reason
    try:
        return AgentResult.model_validate(run.result), None, ""
    except ValidationError as exc:
        first = exc.errors(include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        return None, "invalid", f"malformed result document: {where}: {first['msg']}"


def workspaces_dir(env: Environment) -> Path:
    """Where workspaces live: state/workspaces/task-N-PHASE-ATTEMPT (cleanup finds them
    by the task-N- prefix)."""
    folder = env.state_dir / "workspaces"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder
