"""The prompts each model phase starts from; every phase starts a fresh session."""

from __future__ import annotations

from aiworker.adapters.forgejo.models import Issue, PullRequest


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


def review_prompt(pull: PullRequest) -> str:
    return (
        f"Review pull request #{pull.number}: {pull.title}\n\n{pull.body}\n\n"
        "Inspect the source at this head; report findings; do not change files.\n"
    )
