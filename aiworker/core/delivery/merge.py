"""`aiworker merge --task ID`: merge only what was reviewed and tested at the exact head.

Merging needs an APPROVED review by the reviewer identity on the head, a
successful `aiworker / ci` status on the head, authorisation that still holds (one
taken back pauses the task), the scope the work was checked for (an issue edited
since goes to a repair episode), a base that has not moved into a conflict with the
work (one that did goes to a conflict-repair episode, as at publication: the forge
could never merge it), and a PR head that has not moved; Forgejo's head_commit_id
guard closes the last window. A plan or a legacy feature, reviewed as a whole, also needs passing
combined validation receipts (the issue's checks and every milestone's) at the
head. The merge commit is recorded as evidence, with every milestone's head.
"""

from __future__ import annotations

from aiworker.adapters.forgejo.models import Issue, PullRequest
from aiworker.core.delivery.refresh import merge_moved_base, refuse_a_broken_base
from aiworker.core.delivery.scope_check import answer_moved_scope, paused_if_withdrawn
from aiworker.core.evidence.authorisation import publication_allowed
from aiworker.core.evidence.ci_status import CI_CONTEXT, ours_passed
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.intake.standing import still_authorized
from aiworker.core.phases.at_head import pull_at_head
from aiworker.core.phases.job import Job
from aiworker.core.phases.merged import MergeReport, merged
from aiworker.core.phases.outcome import Outcome
from aiworker.core.tasks.milestones import checks_of
from aiworker.errors import Conflict, NeedsPerson
from aiworker.runtime.failpoints import failpoint
from aiworker.runtime.gitcache import GitCache
from aiworker.store.engine import Database
from aiworker.store.tasks import append_event


def _refusals(
    db: Database,
    access: ForgeAccess,
    job: Job,
    issue: Issue,
) -> list[str]:
    """Why the PR may not be merged now; empty when it may."""
    task, repo = job.task, job.repo
    assert job.pr is not None
    head = task.head_commit
    reviewer = access.required("reviewer")
    reviewer_login = access.logins["reviewer"]
    reasons = []
    reviews = reviewer.reviews(repo.owner, repo.name, job.pr)
    if not any(
        r.state == "APPROVED"
        and r.commit_id == head
        and r.user is not None
        and r.user.login == reviewer_login
        for r in reviews
    ):
        reasons.append(f"no APPROVED review by {reviewer_login} on {head}")
    # Only our own CI's word counts: anyone with Write can post a status in its context.
    # Ours: the identity that posts statuses now, or the worker (which posted them before
    # a `ci` identity was configured).
    ours = {access.logins[access.status_role()], access.logins["worker"]}
    statuses = reviewer.combined_status(repo.owner, repo.name, str(head)).statuses
    if not ours_passed(statuses, ours):
        by = " or ".join(sorted(ours))
        reasons.append(f"no successful '{CI_CONTEXT}' status by {by} on {head}")
    if task.kind in ("feature", "plan"):
        # Reviewed as a whole: combined validation receipts must hold at the final head.
        assert task.base_commit is not None
        allowed, why = publication_allowed(
            db,
            task.id,
            head=str(head),
            base=task.base_commit,
            scope=task.scope_fingerprint,
            requirements=checks_of(db, task, issue.body),
        )
        if not allowed:
            reasons.append(f"no combined validation: {why}")
    return reasons


def _not_against_a_person(
    access: ForgeAccess, job: Job, issue: Issue, pull: PullRequest
) -> tuple[str, str]:
    """The default branch and its tip (both it and the head in the git cache), or
    NeedsPerson when a person closed the issue, pointed the PR at another branch than the
    one its checks and review were for, or rewrote that branch so that it no longer holds
    the base the work was built on (merging would bring back what they removed)."""
    task, repo = job.task, job.repo
    assert task.base_commit is not None
    if issue.state == "closed":
        raise NeedsPerson(
            f"issue #{issue.number} was closed on the forge (reopen it, or cancel task {task.id})"
        )
    worker = access.required("worker")
    forge_repo = worker.repository(repo.owner, repo.name)
    target = forge_repo.default_branch
    if pull.base.ref != target:
        raise NeedsPerson(
            f"PR #{pull.number} now targets {pull.base.ref}, not {target}, which its checks and "
            f"review were for (point it back, or cancel task {task.id})"
        )
    tip = worker.branch(repo.owner, repo.name, target).commit.id
    cache = GitCache(job.env.state_dir)
    token = access.token("worker")
    cache.ensure(repo.index, forge_repo.clone_url, token, tip, str(task.head_commit))
    if not cache.contains(repo.index, task.base_commit, tip):
        raise NeedsPerson(
            f"{target} was rewritten: it no longer holds {task.base_commit[:12]}, the base "
            f"this work was built and checked on, and merging would bring back what was "
            f"removed (start it over: `aiworker task retry --from-start {task.id}`, or cancel it)"
        )
    return target, tip


def merge(job: Job) -> Outcome:
    env, db, task, repo = job.env, job.db, job.task, job.repo
    head = task.head_commit
    assert head is not None
    assert task.base_commit is not None
    assert job.pr is not None
    job.start(None, {"head": head})
    access = ForgeAccess(env.loaded)
    reviewer = access.required("reviewer")
    pull = pull_at_head(job, reviewer)
    report = MergeReport(task.id, job.pr, head, None, None)
    job.report = report
    if not pull.merged:  # merged already: by a run that died after the request, or a person
        issue = access.required("worker").issue(repo.owner, repo.name, task.issue_number or 0)
        decision = still_authorized(env, access, repo.owner, repo.name, task, issue)
        # Authorisation taken back: paused. Work done for an issue that changed since:
        # repaired first (a plan approved again first).
        stopped = paused_if_withdrawn(decision, report) or answer_moved_scope(
            job, access.required("worker"), issue, report
        )
        if stopped is not None:  # a repair is claimed at once; a pause asks for no check
            return stopped.ended("succeeded", f"not merged: {stopped.reason}")
        target, tip = _not_against_a_person(access, job, issue, pull)
        if tip != task.base_commit:
            # A base that moved into a conflict is one the forge can never merge: the
            # conflict is repaired (and the repaired head checked and reviewed again).
            moved = merge_moved_base(job, access.required("worker"), tip, target, report)
            if isinstance(moved, Outcome):
                refuse_a_broken_base(job, tip, target)
                return moved.ended("succeeded", f"not merged: {moved.reason}")
        reasons = _refusals(db, access, job, issue)
        if reasons:
            with db.write() as session:
                append_event(session, "merge.refused", task_id=task.id, data={"reasons": reasons})
            raise Conflict(f"task {task.id} is not mergeable: " + "; ".join(reasons))
        reviewer.merge_pull(repo.owner, repo.name, job.pr, style="merge", head_commit_id=head)
        failpoint("merge.after_request")
        pull = reviewer.pull(repo.owner, repo.name, job.pr)
    ours = pull.merged_by is None or pull.merged_by.login == access.logins["reviewer"]
    return merged(job, pull, reviewer, ours=ours)
