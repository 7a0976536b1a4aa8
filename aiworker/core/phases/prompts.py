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


def review_prompt(pull: PullRequest) -> str:
    return (
        f"Review pull request #{pull.number}: {pull.title}\n\n{pull.body}\n\n"
        "Inspect the source at this head; report findings; do not change files.\n"
    )
