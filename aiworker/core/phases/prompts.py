"""The prompts each model phase starts from; every phase starts a fresh session."""

from __future__ import annotations

import json

from aiworker.adapters.forgejo.models import Issue, PullRequest
from aiworker.contracts.agent import MilestoneSpec
from aiworker.core.intake.images import IssueImages
from aiworker.store.models import Repository, Task


def implementation_prompt(issue: Issue) -> str:
    return (
        f"# {issue.title}\n\n{issue.body}\n\nWork on branch `work`; commit your "
        "changes; finish with the result document. `../aiworker/context.json` says where you "
        "are and lists the issue's images (files under `../aiworker/images/`) and those you "
        "were not given, with why; `../aiworker/continuation.json` is what earlier phases "
        "left: the scope, commits, evidence and how earlier attempts ended.\n"
    )


REPAIR_CAUSES = {
    "review": "An independent review requested changes.",
    "ci": "The repository's CI (`./ci/run`) failed at the branch's head.",
    "conflict": (
        "The base branch moved and merging it into the work conflicts. The merge is already "
        "committed with git's conflict markers left in the conflicting files: resolve them "
        "(keeping both the work's intent and the base's changes) and commit."
    ),
    "base_checks": "The base branch moved; after merging it the required checks fail.",
    "checks": "Every milestone is in, but the plan's combined checks fail at the branch's head.",
    "scope": (
        "The issue's requirements changed after this work was done: make the work meet the "
        "request as it reads now (below)."
    ),
}


def repair_prompt(issue: Issue, cause: str, findings: str) -> str:
    return (
        f"# Repair: {issue.title}\n\n{REPAIR_CAUSES[cause]}\n\nFindings to resolve:\n"
        f"{findings}\n\nThe original request:\n\n{issue.body}\n\nYou are on branch `work` at "
        "the task's current head; earlier commits stay. Commit your fixes and finish with the "
        "result document. A finding you dispute: say so in the result (it goes to a fresh "
        "review); a correction of evidence alone needs no commit. "
        "`../aiworker/continuation.json` holds the scope, the findings, the evidence and how "
        "earlier attempts ended.\n"
    )


def plan_prompt(issue: Issue, limit: int) -> str:
    return (
        f"# Plan: {issue.title}\n\n{issue.body}\n\nYou are at the detached head of the "
        "repository's base; change nothing. Split this work into at most "
        f"{limit} milestones that can be done one after another on one branch, each small "
        "enough for one session, in the result document's `milestones`: a title, its scope, "
        "acceptance criteria, the checks that prove it (`./ci/run ARGS` under a check id) "
        "and `simple` when a small local model could do it. Nothing runs until a person "
        "approves the plan.\n"
    )


def milestone_prompt(issue: Issue, milestone: MilestoneSpec, number: int, total: int) -> str:
    criteria = "\n".join(f"- {c}" for c in milestone.acceptance_criteria)
    return (
        f"# Milestone {number} of {total}: {milestone.title}\n\n{milestone.scope}\n\n"
        f"Acceptance criteria:\n{criteria}\n\nThis milestone is part of a plan for:\n\n"
        f"# {issue.title}\n\n{issue.body}\n\nDo this milestone only. Work on branch `work`, "
        "which holds the earlier milestones; commit your changes; finish with the result "
        "document, reporting each criterion. `../aiworker/continuation.json` is what earlier "
        "phases left.\n"
    )


def review_prompt(pull: PullRequest) -> str:
    return (
        f"Review pull request #{pull.number}: {pull.title}\n\n{pull.body}\n\n"
        "Inspect the source at this head; report findings; do not change files.\n"
    )


def implementation_context(
    repo: Repository, issue: int, base: str, images: IssueImages, milestone: Task | None
) -> str:
    """What the phase is told besides the prompt: where it is, which milestone of its plan
    it is doing, and the issue's images (files beside this one) with those it was not
    given and why."""
    spec = milestone.spec or {} if milestone is not None else {}
    return json.dumps(
        {
            "repository": f"{repo.owner}/{repo.name}",
            "issue": issue,
            "base": base,
            "milestone": {"position": spec["position"], "total": spec["total"]} if spec else None,
            "images": images.accepted,
            "images_not_given": images.rejected,
        }
    )
