"""What Forgejo records when a pull request's head branch moves: a `pull_push` event."""

from __future__ import annotations

import json
from typing import Any

from aiworker.sandbox.gitrepo import BareRepo
from aiworker.sandbox.state import ForgeState


def record_pushes(
    state: ForgeState,
    repo: dict[str, Any],
    git: BareRepo,
    before: dict[str, str],
    user: str,
) -> None:
    """For each open pull request whose head branch moved since BEFORE (branch -> sha),
    a pull_push event listing the new commits, or marking a force push."""
    after = dict(git.branches())
    for issue in repo["issues"]:
        meta = issue["pull"]
        if not meta or issue["state"] != "open":
            continue
        old, new = before.get(meta["head"]), after.get(meta["head"])
        if old is None or new is None or old == new:
            continue
        forced = not git.is_ancestor(old, new)
        commits = [] if forced else [e.sha for e in reversed(git.log(f"{old}..{new}"))]
        body = {"is_force_push": forced, "commit_ids": [old, new] if forced else commits}
        state.record(issue, "pull_push", user, body=json.dumps(body))
        state.touch(issue)
    state.save()
