"""`aiworker review --task ID`: an independent review of the PR head by the reviewer identity.

The review phase runs with its own provider settings on a read-only workspace
of the exact head; its result document decides the formal review: blocking
findings (major, blocker) or an incomplete review request changes, anything
else approves. The review is posted on the head commit it inspected.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from aiworker.contracts.agent import AgentResult
from aiworker.core.context import Environment
from aiworker.core.delivery.pull import load_delivery, move, pull_at_head
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.phases.run import run_provider
from aiworker.core.providers.admission import provider_settings, select_provider
from aiworker.core.providers.registry import (
    backoffs,
    capability_check,
    observe,
    provider_for,
    read_provider,
)
from aiworker.errors import Unavailable
from aiworker.runtime.gitcache import GitCache
from aiworker.runtime.workspace import LocalBackend
from aiworker.store.attempts import finish_attempt, start_attempt
from aiworker.store.observations import record_run, running_jobs

PHASE = "review"
BACKEND = LocalBackend()
BLOCKING = ("major", "blocker")


def review_body(result: AgentResult) -> str:
    lines = [result.summary]
    for finding in result.findings:
        where = (
            f" ({finding.path}:{finding.line})"
            if finding.path and finding.line
            else (f" ({finding.path})" if finding.path else "")
        )
        lines.append(f"- [{finding.severity}] {finding.message}{where}")
    return "\n".join(lines)


def review(env: Environment, task_id: int) -> dict[str, Any]:
    config = env.loaded.config
    db = env.open_database()
    try:
        delivery = load_delivery(db, task_id, "awaiting_review")
        task, repo = delivery.task, delivery.repo
        assert task.head_commit is not None
        access = ForgeAccess(env.loaded)
        reviewer = access.required("reviewer")
        pull = pull_at_head(reviewer, delivery)
        now = datetime.now(UTC)
        with db.read() as session:
            running = running_jobs(session)
            backoff = backoffs(session, config.providers)
        selection = select_provider(
            config,
            PHASE,
            lambda n: read_provider(env, n, now),
            running,
            now,
            backoff=backoff,
            capable=capability_check(env, PHASE),
        )
        observe(db, selection.decisions)
        if selection.provider is None:
            raise Unavailable("no provider is eligible for review now")
        name = selection.provider
        settings = provider_settings(config, PHASE, name)
        model, effort = (settings.model, settings.effort) if settings else (None, None)
        with db.write() as session:
            attempt = start_attempt(
                session,
                task.id,
                PHASE,
                name,
                model,
                effort,
                {**(settings.model_dump() if settings else {}), "head": task.head_commit},
            )
        cache = GitCache(env.state_dir)
        root = env.state_dir / "workspaces" / f"task-{task.id}-review-{attempt}"
        root.parent.mkdir(mode=0o700, exist_ok=True)
        ref = f"refs/aiworker/review/task-{task.id}"
        bundle = cache.bundle_commit(
            repo.index, task.head_commit, ref, root.parent / f"review-{attempt}.bundle"
        )
        prompt = (
            f"Review pull request #{pull.number}: {pull.title}\n\n{pull.body}\n\n"
            "Inspect the source at this head; report findings; do not change files.\n"
        )
        workspace = BACKEND.prepare(
            root,
            bundle,
            ref,
            {
                "prompt.md": prompt,
                "result-schema.json": json.dumps(AgentResult.model_json_schema()),
                "context.json": json.dumps({"pr": pull.number, "head": task.head_commit}),
            },
        )
        bundle.unlink(missing_ok=True)
        run = run_provider(
            provider_for(env, name), workspace, model, effort, attempt, PHASE, backend=BACKEND
        )
        BACKEND.teardown(workspace, preserve=False)
        try:
            result = AgentResult.model_validate(run.result) if run.failure is None else None
        except ValidationError as exc:
            result, run.failure, run.reason = (
                None,
                "invalid",
                f"malformed result: {exc.errors()[0]['msg']}",
            )
        with db.write() as session:
            finish_attempt(
                session,
                attempt,
                "succeeded" if result else (run.failure or "failed"),
                refunded=run.failure == "quota_exhausted",
            )
            record_run(session, name, "ok" if result else (run.failure or "other"), run.reason)
        if result is None:
            return {"task": task.id, "pr": pull.number, "event": None, "reason": run.reason}
        blocking = [f for f in result.findings if f.severity in BLOCKING]
        event = "REQUEST_CHANGES" if blocking or result.completion != "complete" else "APPROVED"
        posted = reviewer.create_review(
            repo.owner,
            repo.name,
            pull.number,
            event=event,
            body=review_body(result),
            commit_id=task.head_commit,
        )
        move(
            db,
            task,
            "awaiting_review",
            "approved" if event == "APPROVED" else "failed",
            "review.posted",
            {"event": event, "review": posted.id, "head": task.head_commit},
        )
        return {
            "task": task.id,
            "pr": pull.number,
            "event": event,
            "review": posted.id,
            "provider": name,
            "findings": [f.model_dump() for f in result.findings],
        }
    finally:
        db.dispose()
