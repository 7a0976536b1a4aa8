"""The sandbox's bare repositories: refs, branches, commits and git's smart HTTP."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from aiworker.runtime.processes import CommandResult, run_binary, run_command

GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LANG": "C",
    # Paths from requests are paths, never pathspec magic such as `:(exclude)x`.
    "GIT_LITERAL_PATHSPECS": "1",
}
SANDBOX_IDENTITY = {
    "GIT_AUTHOR_NAME": "Sandbox Forge",
    "GIT_AUTHOR_EMAIL": "forge@sandbox.invalid",
    "GIT_COMMITTER_NAME": "Sandbox Forge",
    "GIT_COMMITTER_EMAIL": "forge@sandbox.invalid",
}


class GitFailed(Exception):
    pass


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    message: str
    timestamp: str


@dataclass(frozen=True)
class LogEntry:
    sha: str
    tree: str
    parents: tuple[str, ...]
    author: tuple[str, str, str]  # name, email, ISO date
    committer: tuple[str, str, str]
    message: str


@dataclass(frozen=True)
class FileChange:
    status: str  # Forgejo's words: added, deleted, modified, renamed, copied, changed
    filename: str
    previous: str
    additions: int
    deletions: int


@dataclass(frozen=True)
class TreeEntry:
    mode: str
    kind: str  # blob, tree, commit
    sha: str
    size: int
    path: str


_LOG_FORMAT = "%H%x1f%T%x1f%P%x1f%an%x1f%ae%x1f%aI%x1f%cn%x1f%ce%x1f%cI%x1f%B%x1e"
_STATUS_WORDS = {"A": "added", "D": "deleted", "M": "modified", "R": "renamed", "C": "copied"}


class BareRepo:
    def __init__(self, path: Path) -> None:
        self.path = path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.path), **GIT_ENV}
        env.update(extra or {})
        return env

    def git(
        self, *args: str, extra_env: dict[str, str] | None = None, input_text: str | None = None
    ) -> CommandResult:
        return run_command(
            ["git", "--git-dir", str(self.path), *args],
            env=self.env(extra_env),
            input_text=input_text,
            timeout=120,
        )

    def must(
        self, *args: str, extra_env: dict[str, str] | None = None, input_text: str | None = None
    ) -> str:
        result = self.git(*args, extra_env=extra_env, input_text=input_text)
        if not result.ok:
            raise GitFailed(f"git {args[0]} failed: {result.stderr.strip()[:500]}")
        return result.stdout.strip()

    def init(self, default_branch: str) -> None:
        if (self.path / "HEAD").exists():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        run_command(
            ["git", "init", "--bare", "-q", "-b", default_branch, str(self.path)],
            env=self.env(),
            timeout=60,
        )
        self.must("config", "http.receivepack", "true")

    def branch_sha(self, branch: str) -> str | None:
        result = self.git("rev-parse", "--verify", "-q", f"refs/heads/{branch}^{{commit}}")
        return result.stdout.strip() if result.ok else None

    def resolve(self, ref: str) -> str | None:
        result = self.git("rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
        return result.stdout.strip() if result.ok else None

    def branches(self) -> list[tuple[str, str]]:
        out = self.must("for-each-ref", "refs/heads", "--format=%(refname:short) %(objectname)")
        return [tuple(line.split(" ", 1)) for line in out.splitlines() if line]  # type: ignore[misc]

    def refs(self, prefix: str) -> list[tuple[str, str, str]]:
        out = self.must("for-each-ref", "--format=%(refname) %(objectname) %(objecttype)")
        rows = [tuple(line.split(" ")) for line in out.splitlines() if line]
        return [r for r in rows if r[0].startswith(prefix)]  # type: ignore[misc]

    def commit(self, sha: str) -> CommitInfo:
        out = self.must("show", "-s", "--format=%H%x00%B%x00%cI", sha)
        full, message, stamp = out.split("\x00", 2)
        return CommitInfo(full, message.strip(), stamp.strip())

    def is_ancestor(self, older: str, newer: str) -> bool:
        return self.git("merge-base", "--is-ancestor", older, newer).ok

    def merge_base(self, a: str, b: str) -> str | None:
        result = self.git("merge-base", a, b)
        return result.stdout.strip() if result.ok else None

    def update_ref(self, branch: str, new: str, old: str | None) -> bool:
        args = ["update-ref", f"refs/heads/{branch}", new]
        if old is not None:
            args.append(old)
        return self.git(*args).ok

    def delete_branch(self, branch: str) -> bool:
        return self.git("update-ref", "-d", f"refs/heads/{branch}").ok

    def log(self, rev: str, *, path: str = "", skip: int = 0, limit: int = 0) -> list[LogEntry]:
        """Commits reachable from REV, newest first (only those touching PATH if given)."""
        args = ["log", f"--format={_LOG_FORMAT}", f"--skip={skip}"]
        if limit:
            args.append(f"--max-count={limit}")
        args += [rev, "--"] + ([path] if path else [])
        entries = []
        for record in self.must(*args).split("\x1e"):
            fields = record.strip("\n").split("\x1f")
            if len(fields) != 10:
                continue
            sha, tree, parents, *people, message = fields
            entries.append(
                LogEntry(
                    sha,
                    tree,
                    tuple(parents.split()),
                    (people[0], people[1], people[2]),
                    (people[3], people[4], people[5]),
                    message,
                )
            )
        return entries

    def count(self, rev: str, path: str = "") -> int:
        return int(self.must("rev-list", "--count", rev, "--", *([path] if path else [])) or 0)

    def changes(self, base: str, head: str) -> list[FileChange]:
        """The files HEAD changes against BASE (a three-dot diff, as a pull request shows);
        without a BASE, everything a root commit HEAD adds."""
        if base:
            args, span = ["-c", "core.quotepath=off", "diff", "-M"], f"{base}...{head}"
        else:
            args = ["-c", "core.quotepath=off", "diff-tree", "--root", "-r", "-M", "--no-commit-id"]
            span = head
        names = self.must(*args, "--name-status", span).splitlines()
        counts = self.must(*args, "--numstat", span).splitlines()
        rows = []
        for named, counted in zip(names, counts, strict=False):
            status, *paths = named.split("\t")
            adds, dels, _ = counted.split("\t", 2)
            rows.append(
                FileChange(
                    _STATUS_WORDS.get(status[:1], "changed"),
                    paths[-1],
                    paths[0] if len(paths) > 1 else "",
                    int(adds) if adds.isdigit() else 0,
                    int(dels) if dels.isdigit() else 0,
                )
            )
        return rows

    def patch_text(self, base: str, head: str, *, as_mail: bool = False) -> str:
        if as_mail:
            return self.must("format-patch", "--stdout", f"{base}..{head}") + "\n"
        return self.must("diff", "-M", f"{base}...{head}") + "\n"

    def tree(self, rev: str, path: str) -> list[TreeEntry] | None:
        """The entry at PATH in REV, or the entries inside it when it is a directory;
        None when there is no such path."""
        clean = path.strip("/")
        entries = self._ls_tree(rev, clean) if clean else []
        if clean and not entries:
            return None
        if not clean or entries[0].kind == "tree":
            return self._ls_tree(rev, f"{clean}/" if clean else "")
        return entries

    def _ls_tree(self, rev: str, path: str) -> list[TreeEntry]:
        result = self.git("ls-tree", "-l", "-z", rev, "--", *([path] if path else []))
        if not result.ok:
            return []
        rows = []
        for line in result.stdout.split("\0"):
            if not line:
                continue
            meta, name = line.split("\t", 1)
            mode, kind, sha, size = meta.split()
            rows.append(TreeEntry(mode, kind, sha, int(size) if size.isdigit() else 0, name))
        return rows

    def blob(self, sha: str) -> bytes:
        rc, out, err = run_binary(
            ["git", "--git-dir", str(self.path), "cat-file", "blob", sha], env=self.env()
        )
        if rc != 0:
            raise GitFailed(f"git cat-file failed: {err.decode(errors='replace')[:300]}")
        return out

    def diff_stats(self, base: str, head: str) -> tuple[int, int, int]:
        out = self.must("diff", "--numstat", f"{base}...{head}")
        adds = dels = files = 0
        for line in out.splitlines():
            a, d, _ = line.split("\t", 2)
            files += 1
            adds += int(a) if a.isdigit() else 0
            dels += int(d) if d.isdigit() else 0
        return adds, dels, files


def http_backend(
    project_root: Path,
    *,
    method: str,
    path_info: str,
    query: str,
    content_type: str,
    body: bytes,
    remote_user: str,
    git_protocol: str | None,
) -> tuple[int, list[tuple[str, str]], bytes]:
    """Run one request through `git http-backend` (CGI) and parse its reply."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_PROJECT_ROOT": str(project_root),
        "GIT_HTTP_EXPORT_ALL": "1",
        "REQUEST_METHOD": method,
        "PATH_INFO": path_info,
        "QUERY_STRING": query,
        "CONTENT_TYPE": content_type,
        "CONTENT_LENGTH": str(len(body)),
        "REMOTE_USER": remote_user,
        "REMOTE_ADDR": "127.0.0.1",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(project_root),
    }
    if git_protocol:
        env["GIT_PROTOCOL"] = git_protocol
    rc, out, err = run_binary(["git", "http-backend"], input_bytes=body, env=env)
    if rc != 0 and not out:
        return 500, [("Content-Type", "text/plain")], err[:2000]
    head, _, payload = out.partition(b"\r\n\r\n")
    if not _:
        head, _, payload = out.partition(b"\n\n")
    status = 200
    headers = []
    for line in head.decode("latin-1").splitlines():
        name, _, value = line.partition(":")
        if name.lower() == "status":
            status = int(value.strip().split()[0])
        elif name:
            headers.append((name.strip(), value.strip()))
    return status, headers, payload
