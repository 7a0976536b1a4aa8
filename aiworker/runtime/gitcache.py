"""One bare cache per repository under the state directory, fetched from the forge.

Base and head are pinned by full hash in slot-specific refs; bundles carry
history to workspaces and back; an imported result must descend from the
pinned base or it is rejected. Mutations hold a short per-repository lock. The
forge token travels in an environment-provided HTTP header, never in a URL,
argv or the cache's config.
"""

from __future__ import annotations

import base64
import codecs
import logging
import os
import re
from contextlib import AbstractContextManager
from pathlib import Path

from aiworker.runtime.git_failures import GitCacheError, failure, got_through, refuse_full
from aiworker.runtime.locks import FileLock, LockDir
from aiworker.runtime.processes import CommandResult, run_command

progress = logging.getLogger("aiworker.progress")  # shown as it happens in a terminal

FULL_HASH = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
LOCK_SECONDS = 60.0


class AncestryRejected(GitCacheError):
    code = "ancestry_rejected"


class MergeConflicts(GitCacheError):
    code = "merge_conflicts"


# refs/aiworker/review/task-N and refs/aiworker/task-N/...; slot pins are not a task's.
TASK_REF = re.compile(r"^refs/aiworker/(?:review/)?task-(\d+)(?:/|$)")


def _remote(url: str, token: str | None) -> None:
    """URL as git is given it: never an option (`--upload-pack=...`), and an http(s) URL
    wherever a token goes with it."""
    if url.startswith("-") or (token is not None and not url.startswith(("http://", "https://"))):
        raise GitCacheError(f"refusing the remote {url[:80]!r}: not an http(s) URL")


class GitCache:
    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "git-cache"
        self.locks = LockDir(state_dir)

    def path(self, index: int) -> Path:
        return self.root / f"repo-{index}.git"

    def _git(
        self,
        index: int,
        *args: str,
        token: str | None = None,
        timeout: float = 600,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        extra = env or {}
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_NOSYSTEM": "1",
            "LANG": "C",
        }
        if token is not None:
            basic = base64.b64encode(f"aiworker:{token}".encode()).decode()
            # The header goes with every request of the command: never to where a redirect
            # points (git moves its whole URL there), and over http(s) alone.
            config = {
                "http.extraHeader": f"Authorization: Basic {basic}",
                "http.followRedirects": "false",
                "protocol.allow": "never",
                "protocol.http.allow": "always",
                "protocol.https.allow": "always",
            }
            env["GIT_CONFIG_COUNT"] = str(len(config))
            for number, (key, value) in enumerate(config.items()):
                env[f"GIT_CONFIG_KEY_{number}"] = key
                env[f"GIT_CONFIG_VALUE_{number}"] = value
        return run_command(
            ["git", "--git-dir", str(self.path(index)), *args],
            env={**env, **extra},
            timeout=timeout,
        )

    def _must(self, index: int, *args: str, token: str | None = None) -> str:
        result = self._git(index, *args, token=token)
        if not result.ok:
            raise failure(self.path(index), args[0], result.stderr)
        if args[0] in ("fetch", "push", "ls-remote"):
            got_through(self.path(index))
        return result.stdout.strip()

    def _locked(self, index: int) -> AbstractContextManager[FileLock]:
        return self.locks.held(f"gitcache-{index}", timeout=LOCK_SECONDS)

    def fetch(self, index: int, url: str, token: str | None) -> dict[str, str]:
        """Bring the cache up to date with the forge; return branch -> full hash."""
        _remote(url, token)
        with self._locked(index):
            first = not (self.path(index) / "HEAD").exists()
            if first:
                progress.info("repository %d: a first fetch, of its whole history", index)
                self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
                result = run_command(
                    ["git", "init", "--bare", "-q", str(self.path(index))], timeout=60
                )
                if not result.ok:
                    refuse_full(self.path(index), result.stderr)
                    raise GitCacheError(f"cannot create cache {index}: {result.stderr.strip()}")
            self._must(
                index,
                "fetch",
                "--prune",
                "--quiet",
                url,
                "+refs/heads/*:refs/remotes/origin/*",
                token=token,
            )
            if first:
                progress.info("repository %d: fetched into the cache", index)
        out = self._must(
            index,
            "for-each-ref",
            "refs/remotes/origin",
            "--format=%(refname:strip=3) %(objectname)",
        )
        return dict(line.split(" ", 1) for line in out.splitlines() if line)

    def task_refs(self, index: int) -> dict[int, list[str]]:
        """The refs kept for tasks (a review's, a refreshed base's) by task id."""
        if not (self.path(index) / "HEAD").exists():
            return {}
        out = self._must(index, "for-each-ref", "--format=%(refname)", "refs/aiworker/")
        found: dict[int, list[str]] = {}
        for ref in out.splitlines():
            match = TASK_REF.match(ref)
            if match:
                found.setdefault(int(match.group(1)), []).append(ref)
        return found

    def delete_ref(self, index: int, ref: str) -> None:
        with self._locked(index):
            self._must(index, "update-ref", "-d", ref)

    def ensure(self, index: int, url: str, token: str | None, *commits: str) -> None:
        """Fetch repository INDEX unless this cache already has every one of COMMITS: a
        step on another controller than the one that worked on the task finds its pushed
        commits here too."""
        if self.path(index).exists():
            try:
                for commit in commits:
                    self.resolve(index, commit)
                return
            except GitCacheError:
                pass
        self.fetch(index, url, token)

    def resolve(self, index: int, ref: str) -> str:
        full = self._must(index, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
        if not FULL_HASH.match(full):
            raise GitCacheError(f"{ref} did not resolve to a full commit hash")
        return full

    def commits(self, index: int, base: str, head: str) -> list[str]:
        """The commits HEAD has that BASE has not, oldest first (full hashes)."""
        out = self._must(index, "rev-list", "--reverse", f"{base}..{head}")
        return out.split()

    def file_mode(self, index: int, commit: str, path: str) -> str | None:
        """The git mode of PATH in COMMIT's tree (100755 executable, 120000 a link), or None."""
        result = self._git(index, "ls-tree", "--full-tree", commit, "--", path)
        if not result.ok or not result.stdout.strip():
            return None
        return result.stdout.split(" ", 1)[0]

    def tree_entries(self, index: int, commit: str) -> list[tuple[str, bytes]]:
        """Every entry of COMMIT's whole tree: (git mode, path as the bytes it holds)."""
        entries = []
        for line in self._must(index, "ls-tree", "-r", "--full-tree", commit).splitlines():
            meta, _, path = line.partition("\t")
            mode = meta.split(" ", 1)[0]
            # A name git quoted (core.quotePath): C escapes, octal for each byte past ASCII.
            raw = codecs.escape_decode(path[1:-1])[0] if path.startswith('"') else path.encode()
            entries.append((mode, raw))
        return entries

    def pin(self, index: int, slot: int, name: str, commit: str) -> str:
        """Pin COMMIT (any revision) as refs/aiworker/slot-N/NAME by its full hash."""
        with self._locked(index):
            full = self.resolve(index, commit)
            self._must(index, "update-ref", f"refs/aiworker/slot-{slot}/{name}", full)
        return full

    def pinned(self, index: int, slot: int, name: str) -> str | None:
        result = self._git(
            index, "rev-parse", "--verify", "-q", f"refs/aiworker/slot-{slot}/{name}"
        )
        return result.stdout.strip() if result.ok else None

    def bundle_out(self, index: int, slot: int, target: Path) -> Path:
        """A bundle of the pinned base for a workspace, which takes it with
        `git fetch BUNDLE refs/aiworker/slot-N/base:refs/heads/base`."""
        base = self.pinned(index, slot, "base")
        if base is None:
            raise GitCacheError(f"slot {slot} has no pinned base")
        self._must(index, "bundle", "create", "-q", str(target), f"refs/aiworker/slot-{slot}/base")
        return target

    def push(self, index: int, commit: str, url: str, token: str, branch: str) -> None:
        """Push COMMIT (by full hash) to BRANCH on the forge; the branch belongs to the task."""
        _remote(url, token)
        full = self.resolve(index, commit)
        with self._locked(index):
            self._must(
                index, "push", "--quiet", "--force", url, f"{full}:refs/heads/{branch}", token=token
            )

    def bundle_commit(self, index: int, commit: str, ref: str, target: Path) -> Path:
        """A bundle holding COMMIT as REF (under refs/aiworker/), for a read-only workspace."""
        if not ref.startswith("refs/aiworker/"):
            raise GitCacheError(f"{ref} is not an aiworker ref")
        with self._locked(index):
            self._must(index, "update-ref", ref, self.resolve(index, commit))
            self._must(index, "bundle", "create", "-q", str(target), ref)
        return target

    def import_result(self, index: int, slot: int, bundle: Path, ref: str = "HEAD") -> str:
        """Take a workspace's result bundle; its head must descend from the pinned base."""
        base = self.pinned(index, slot, "base")
        if base is None:
            raise GitCacheError(f"slot {slot} has no pinned base")
        incoming = f"refs/aiworker/slot-{slot}/incoming"
        with self._locked(index):
            self._must(index, "bundle", "verify", "-q", str(bundle))
            self._must(index, "fetch", "--quiet", str(bundle), f"+{ref}:{incoming}")
            head = self.resolve(index, incoming)
            if not self._git(index, "merge-base", "--is-ancestor", base, head).ok:
                self._git(index, "update-ref", "-d", incoming)
                raise AncestryRejected(
                    f"result head {head} does not descend from the pinned base {base}"
                )
            self._must(index, "update-ref", f"refs/aiworker/slot-{slot}/head", head)
            self._git(index, "update-ref", "-d", incoming)
        return head

    def merge_of(self, index: int, ref: str, head: str, base: str) -> str | None:
        """REF's commit when it is a merge of exactly BASE into HEAD, else None."""
        found = self._git(index, "rev-list", "--parents", "-n", "1", ref)
        parts = found.stdout.split() if found.ok else []
        return parts[0] if parts[1:] == [head, base] else None

    def contains(self, index: int, ancestor: str, commit: str) -> bool:
        """Whether COMMIT has ANCESTOR in its history (or is it)."""
        return self._git(index, "merge-base", "--is-ancestor", ancestor, commit).ok

    def with_markers(self, index: int, commit: str, paths: list[str]) -> list[str]:
        """Those of PATHS that still hold conflict markers in COMMIT's tree."""
        if not paths:
            return []
        pattern = "^(<<<<<<<|>>>>>>>)( |$)"
        found = self._git(index, "grep", "-l", "-z", "-E", pattern, commit, "--", *paths)
        prefix = f"{commit}:"
        return sorted(name.removeprefix(prefix) for name in found.stdout.split("\0") if name)

    def merge_into(
        self,
        index: int,
        head: str,
        base: str,
        ref: str,
        message: str,
        author: tuple[str, str],
        *,
        keep_conflicts: bool = False,
    ) -> tuple[str, list[str]]:
        """An ordinary merge commit of BASE into HEAD (parents HEAD, BASE), made without a
        work tree and kept as REF (under refs/aiworker/), and the files that conflicted.
        MergeConflicts names those files when they conflict, unless KEEP_CONFLICTS: then
        the commit holds them with git's conflict markers, for a repair to resolve, and is
        kept as REF-conflicted (so REF only ever names a clean merge: merge_of)."""
        if not ref.startswith("refs/aiworker/"):
            raise GitCacheError(f"{ref} is not an aiworker ref")
        name, email = author
        identity = {
            "GIT_AUTHOR_NAME": name,
            "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name,
            "GIT_COMMITTER_EMAIL": email,
        }
        with self._locked(index):
            head, base = self.resolve(index, head), self.resolve(index, base)
            # NUL-separated: the names come as they are, not in git's quoting of
            # non-ASCII names, so that they can be looked up in the tree again.
            merged = self._git(index, "merge-tree", "--write-tree", "--name-only", "-z", head, base)
            lines = [name for name in merged.stdout.split("\0\0", 1)[0].split("\0") if name]
            lines = lines or [""]
            conflicts = list(dict.fromkeys(lines[1:])) if merged.returncode == 1 else []
            if conflicts and not keep_conflicts:
                raise MergeConflicts(
                    f"merging {base} into {head} conflicts in: {', '.join(lines[1:])}"
                )
            if merged.returncode not in (0, 1) or not FULL_HASH.match(lines[0]):
                refuse_full(self.path(index), merged.stderr)
                raise GitCacheError(
                    f"cannot merge {base} into {head}: {merged.stderr.strip()[:300]}"
                )
            commit = self._git(
                index,
                "commit-tree",
                lines[0],
                "-p",
                head,
                "-p",
                base,
                "-m",
                message,
                env=identity,
            )
            if not commit.ok:
                refuse_full(self.path(index), commit.stderr)
                raise GitCacheError(f"cannot record the merge: {commit.stderr.strip()[:300]}")
            full = commit.stdout.strip()
            self._must(index, "update-ref", f"{ref}-conflicted" if conflicts else ref, full)
        return full, conflicts
