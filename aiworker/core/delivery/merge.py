"""`aiworker merge --task ID`: merge only what was reviewed and tested at the exact head.

Merging needs an APPROVED review by the reviewer identity on the head, a
successful `aiworker / ci` status on the head, authorisation that still holds,
and a PR head that has not moved; Forgejo's head_commit_id guard closes the
last window. The merge commit is recorded as evidence.
"""

from __future__ import annotations

from typing import Any

from aiworker.core.context import Environment
from aiworker.core.delivery.pull import CI_CONTEXT, load_delivery, move, pull_at_head, record
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.intake.authorization import PermissionReader
from aiworker.core.intake.discovery import authorize
from aiworker.errors import Conflict
from aiworker.store.receipts import add_receipt


def merge(env: Environment, task_id: int) -> dict[str, Any]:
    db = env.open_database()
    try:
        delivery = load_delivery(db, task_id, "approved")
        task, repo = delivery.task, delivery.repo
        head = task.head_commit
        assert head is not None
        assert task.base_commit is not None
        access = ForgeAccess(env.loaded)
        reviewer = access.required("reviewer")
        reviewer_login = access.logins["reviewer"]
        pull_at_head(reviewer, delivery)
        reasons = []
        reviews = reviewer.reviews(repo.owner, repo.name, delivery.pr)
        if not any(
            r.state == "APPROVED"
            and r.commit_id == head
            and r.user is not None
            and r.user.login == reviewer_login
            for r in reviews
        ):
            reasons.append(f"no APPROVED review by {reviewer_login} on {head}")
        statuses = reviewer.combined_status(repo.owner, repo.name, head).statuses
        if not any(s.context == CI_CONTEXT and s.status == "success" for s in statuses):
            reasons.append(f"no successful '{CI_CONTEXT}' status on {head}")
        worker = access.required("worker")
        issue = worker.issue(repo.owner, repo.name, task.issue_number or 0)
        decision = authorize(
            worker,
            PermissionReader(access.optional("operator"), access.bots()),
            env.loaded.config,
            repo.owner,
            repo.name,
            task.kind,
            issue,
            access.logins["worker"],
        )
        if not decision.authorized:
            reasons.append(f"authorisation no longer holds: {decision.reason}")
        if reasons:
            record(db, task, "merge.refused", {"reasons": reasons})
            raise Conflict(f"task {task.id} is not mergeable: " + "; ".join(reasons))
        reviewer.merge_pull(repo.owner, repo.name, delivery.pr, style="merge", head_commit_id=head)
        merged = reviewer.pull(repo.owner, repo.name, delivery.pr)
        evidence = {
            "pr": delivery.pr,
            "head": head,
            "merge_commit": merged.merge_commit_sha,
            "merged_at": merged.merged_at.isoformat() if merged.merged_at else None,
        }
        with db.write() as session:
            add_receipt(
                session,
                task_id=task.id,
                phase="merge",
                head=head,
                base=task.base_commit,
                scope=task.scope_fingerprint,
                check_id=None,
                outcome="merged",
                body=evidence,
            )
        move(db, task, "approved", "done", "merge.done", evidence)
        return {"task": task.id, **evidence}
    finally:
        db.dispose()
