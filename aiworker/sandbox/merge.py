"""Merging a pull request in a bare repository with Forgejo's merge styles.

The merge is done in a throwaway clone that borrows the bare repository's
objects, then pushed back with a lease on the base branch, so a base that moved
meanwhile is never overwritten.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from aiworker.runtime.processes import run_command
from aiworker.sandbox.gitrepo import BareRepo

STYLES = ("merge", "rebase", "rebase-merge", "squash", "fast-forward-only", "manually-merged")


class MergeConflict(Exception):
    pass


class MergeNotPossible(Exception):
    pass


def merge_pull(
    repo: BareRepo,
    *,
    base: str,
    head_sha: str,
    head_branch: str,
    style: str,
    number: int,
    title: str,
    merger: str,
    message: str | None = None,
) -> str:
    """Merge HEAD_SHA into BASE with STYLE; return the new base head."""
    base_sha = repo.branch_sha(base)
    if base_sha is None:
        raise MergeNotPossible(f"base branch {base} does not exist")
    default_message = f"Merge pull request '{title}' (#{number}) from {head_branch} into {base}"
    with _Scratch(repo, merger) as git:
        git("checkout", "-q", "-B", "work", base_sha)
        ok, out = _apply_style(
            git,
            style,
            base_sha,
            head_sha,
            message or default_message,
            message or f"{title} (#{number})",
        )
        if not ok:
            raise MergeConflict(out[-500:])
        return _push(git, base, base_sha)


def update_branch(repo: BareRepo, *, head: str, base: str, style: str, user: str) -> str:
    """Bring HEAD up to date with BASE as Forgejo's "update branch" does: merge BASE into
    HEAD, or rebase HEAD onto BASE; return HEAD's new tip."""
    head_sha, base_sha = repo.branch_sha(head), repo.branch_sha(base)
    if head_sha is None or base_sha is None:
        raise MergeNotPossible("head or base branch does not exist")
    with _Scratch(repo, user) as git:
        git("checkout", "-q", "-B", "work", head_sha)
        if style == "rebase":
            ok, out = git("rebase", "-q", base_sha, author=False)
        else:
            message = f"Merge branch '{base}' into {head}"
            ok, out = git("merge", "--no-ff", "-q", "-m", message, base_sha)
        if not ok:
            raise MergeConflict(out[-500:])
        return _push(git, head, head_sha)


class _Scratch:
    """A throwaway clone borrowing the bare repository's objects; `git(...)` runs in it
    as USER (the author unless author=False)."""

    def __init__(self, repo: BareRepo, user: str) -> None:
        self.repo = repo
        self.identity = {
            "GIT_AUTHOR_NAME": user,
            "GIT_AUTHOR_EMAIL": f"{user}@sandbox.invalid",
            "GIT_COMMITTER_NAME": user,
            "GIT_COMMITTER_EMAIL": f"{user}@sandbox.invalid",
        }
        self.work = Path(tempfile.mkdtemp(prefix="sandbox-merge-"))

    def __enter__(self) -> Callable[..., tuple[bool, str]]:
        ok, out = self.run("clone", "-q", "--shared", "--no-checkout", str(self.repo.path), ".")
        if not ok:
            shutil.rmtree(self.work, ignore_errors=True)
            raise MergeNotPossible(out)
        return self.run

    def __exit__(self, *_exc: object) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    def run(self, *args: str, author: bool = True) -> tuple[bool, str]:
        env = self.repo.env(
            self.identity
            if author
            else {k: v for k, v in self.identity.items() if k.startswith("GIT_COMMITTER")}
        )
        result = run_command(["git", "-C", str(self.work), *args], env=env, timeout=120)
        return result.ok, (result.stdout + result.stderr).strip()


def _push(git: Callable[..., tuple[bool, str]], branch: str, expected: str) -> str:
    """Push the scratch branch `work` to BRANCH with a lease on EXPECTED."""
    new_sha = git("rev-parse", "work")[1]
    ok, out = git(
        "push",
        "-q",
        f"--force-with-lease=refs/heads/{branch}:{expected}",
        "origin",
        f"{new_sha}:refs/heads/{branch}",
    )
    if not ok:
        raise MergeConflict(f"branch {branch} moved meanwhile: {out[-300:]}")
    return new_sha


def _apply_style(  # noqa: PLR0911 - one return per merge style
    git: Callable[..., tuple[bool, str]],
    style: str,
    base_sha: str,
    head_sha: str,
    merge_message: str,
    squash_message: str,
) -> tuple[bool, str]:
    """Leave the merged result on branch `work` of the throwaway clone."""
    if style == "merge":
        return git("merge", "--no-ff", "-q", "-m", merge_message, head_sha)
    if style == "squash":
        ok, out = git("merge", "--squash", "-q", head_sha)
        if not ok:
            return ok, out
        return git("commit", "-q", "--allow-empty", "-m", squash_message)
    if style == "fast-forward-only":
        ok, out = git("merge", "--ff-only", "-q", head_sha)
        if not ok:
            raise MergeNotPossible("head is not a descendant of base; cannot fast-forward")
        return ok, out
    if style in ("rebase", "rebase-merge"):
        git("checkout", "-q", "-B", "rebasing", head_sha)
        ok, out = git("rebase", "-q", base_sha, author=False)
        if not ok:
            return ok, out
        rebased = git("rev-parse", "HEAD")[1]
        if style == "rebase":
            return git("checkout", "-q", "-B", "work", rebased)
        git("checkout", "-q", "work")
        return git("merge", "--no-ff", "-q", "-m", merge_message, rebased)
    raise MergeNotPossible(f"merge style {style!r} is not supported")


def mergeable(repo: BareRepo, base_sha: str, head_sha: str) -> bool:
    """Whether HEAD merges into BASE without conflicts (no work tree needed)."""
    result = repo.git("merge-tree", "--write-tree", base_sha, head_sha)
    return result.ok
