"""The local execution backend: a disposable workspace from a git bundle at a pinned commit.

The workspace holds the repository checkout (`repo/`), the phase's inputs
(`aiworker/`: prompt, context, settings, result schema; outside the checkout so
they are never committed) and a private home for credentials, created after
dependency setup and removed at teardown whatever happened. The `qemu` backend
(runtime/guests/backend.py) implements the same steps inside a guest.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aiworker.errors import AiworkerError, DiskFull, says_disk_full
from aiworker.runtime.attempts import remove_attempt
from aiworker.runtime.bubblewrap import Jail, installed, jailed
from aiworker.runtime.credentials import adopt, copy_home, credential_files
from aiworker.runtime.processes import run_command


class WorkspaceError(AiworkerError):
    code = "workspace"


@dataclass(frozen=True)
class Workspace:
    root: Path

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    @property
    def inputs(self) -> Path:
        return self.root / "aiworker"

    @property
    def home(self) -> Path:
        return self.root / "home"


# The job may write anywhere in its workspace (and, unless its phase is read-only, in the
# checkout's .git/config): git on this side reads no configuration outside the checkout,
# and none in it may name a program for git here to run (a file system monitor, hooks).
_GIT_ENV = {
    "HOME": "/nonexistent",
    "XDG_CONFIG_HOME": "/nonexistent",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "LANG": "C",
}
_GIT_PINNED = ("-c", "core.fsmonitor=false", "-c", f"core.hooksPath={os.devnull}")


def _git(workspace: Workspace, *args: str, strip: bool = True) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_GIT_ENV}
    argv = ["git", *_GIT_PINNED, "-C", str(workspace.repo), *args]
    result = run_command(argv, env=env, timeout=300)
    if not result.ok and says_disk_full(result.stderr):
        raise DiskFull(f"workspace {workspace.root}: the disk is full; free space")
    if not result.ok:
        raise WorkspaceError(
            f"git {args[0]} failed in the workspace: {result.stderr.strip()[:300]}"
        )
    return result.stdout.strip() if strip else result.stdout


def prepare_workspace(
    root: Path,
    bundle: Path,
    base_ref: str,
    inputs: dict[str, str | bytes],
    *,
    detached: bool = False,
) -> Workspace:
    """Check out BASE_REF of BUNDLE on branch `work` (or DETACHED at it, for a phase that
    changes nothing) and write the phase's inputs. One that fails part-way is removed (on
    a full disk, what it wrote is the room the failure's record needs)."""
    if root.exists():
        raise WorkspaceError(f"workspace {root} already exists")
    root.mkdir(mode=0o700, parents=True)
    workspace = Workspace(root)
    try:
        workspace.repo.mkdir()
        _git(workspace, "init", "-q")
        _git(workspace, "fetch", "-q", str(bundle), f"{base_ref}:refs/heads/base")
        if detached:
            _git(workspace, "checkout", "-q", "--detach", "base")
        else:
            _git(workspace, "checkout", "-q", "-b", "work", "base")
        write_inputs(workspace, inputs)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return workspace


def altered(workspace: Workspace) -> list[str]:
    """What a job changed in a checkout it was to leave as it was: a moved HEAD, and every
    path `git status` reports (a read-only phase's result is refused for any of them). The
    checkout's .git/config is this side's (the job cannot write it), and git reads no other
    configuration here, so no filter or monitor of the job's runs."""
    found = []
    head, base = _git(workspace, "rev-parse", "HEAD"), _git(workspace, "rev-parse", "base")
    if head != base:
        found.append(f"HEAD moved to {head[:12]}")
    # NUL-separated: a name is given as it is (not quoted), and the first entry's leading
    # space (" M a.txt") survives.
    status = _git(workspace, "status", "--porcelain", "-z", "--no-renames", "-uall", strip=False)
    found += [entry[3:] for entry in status.split("\0") if entry]
    return found


def write_inputs(workspace: Workspace, inputs: dict[str, str | bytes]) -> None:
    """The phase's inputs (prompt, context, settings, schema...) as private files."""
    workspace.inputs.mkdir(mode=0o700)
    for name, content in inputs.items():
        path = workspace.inputs / name
        if workspace.inputs.resolve() not in path.resolve().parents:
            raise WorkspaceError(f"input {name!r} would land outside the inputs")
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        path.write_bytes(data)
        os.chmod(path, 0o600)


def open_private_home(workspace: Workspace) -> Path:
    """The credentials home: made only now, after dependency setup."""
    workspace.home.mkdir(mode=0o700, exist_ok=True)
    (workspace.home / "tmp").mkdir(mode=0o700, exist_ok=True)
    return workspace.home


def _own_objects(workspace: Workspace) -> None:
    """The checkout's repository as this side made it, before git here reads a job's
    commits: its own object store only (a job could point alternates, or a `.git` file,
    at another repository on this host, and its objects would go out with the work)."""
    dot_git = workspace.repo / ".git"
    if dot_git.is_symlink() or not dot_git.is_dir():
        raise WorkspaceError("the job replaced the checkout's .git: its work is not taken")
    for name in ("alternates", "http-alternates"):
        (dot_git / "objects" / "info" / name).unlink(missing_ok=True)
    if (dot_git / "commondir").exists():
        raise WorkspaceError("the job made the checkout a linked worktree: its work is not taken")


def changed_lines(workspace: Workspace) -> int:
    """Lines added plus removed on `work` since `base` (binary files count as one each)."""
    _own_objects(workspace)
    total = 0
    numstat = _git(workspace, "diff", "--no-ext-diff", "--no-textconv", "--numstat", "base...work")
    for line in numstat.splitlines():
        added, removed, _ = line.split("\t", 2)
        total += int(added) + int(removed) if added.isdigit() and removed.isdigit() else 1
    return total


def result_bundle(workspace: Workspace, target: Path) -> Path | None:
    """A bundle of the commits made on `work` since `base`, or None when there are none."""
    _own_objects(workspace)
    if _git(workspace, "rev-list", "--count", "base..work") == "0":
        return None
    _git(workspace, "bundle", "create", "-q", str(target), "base..work")
    return target


def teardown(workspace: Workspace, *, preserve: bool) -> bool:
    """Remove the private home always; the rest unless PRESERVE (work kept for a retry)."""
    remove_attempt(workspace.home)  # whatever a CLI left there, however deep
    if preserve:
        return False
    return remove_attempt(workspace.root).removed


def sandboxed(
    argv: list[str],
    workspace: Workspace,
    writable: list[Path],
    bwrap: str | None = None,
    hidden: list[Path] | None = None,
    read_only: bool = False,
) -> list[str]:
    """ARGV inside bubblewrap when it is installed (runtime/bubblewrap.py): only the
    workspace (and WRITABLE) writable, TMPDIR in the private home, HIDDEN places (other
    providers' homes, the host's secrets) empty, the checkout read-only when READ_ONLY.
    Without bwrap, ARGV."""
    bwrap = bwrap or installed()
    if bwrap is None:
        return argv
    jail = Jail(
        chdir=workspace.repo,
        tmpdir=workspace.home / "tmp",
        empty=workspace.root / "empty",
        writable=[workspace.root, *writable],
        hidden=list(hidden or []),
        read_only=[workspace.repo] if read_only else [],
    )
    return jailed(argv, jail, bwrap)


class ExecutionBackend(Protocol):
    """Where a phase runs: `local` (a directory on this host, in bubblewrap when installed)
    or `qemu` (a disposable guest); the same steps either way."""

    name: str

    def describe(self) -> dict[str, str]: ...

    def route_model(self, target: str) -> None:
        """Let the jobs started from now on reach the local model at TARGET (host:port)."""
        ...

    def prepare(
        self,
        root: Path,
        bundle: Path,
        base_ref: str,
        inputs: dict[str, str | bytes],
        *,
        read_only: bool = False,
    ) -> Workspace: ...

    def altered(self, workspace: Workspace) -> list[str]: ...

    def open_home(self, workspace: Workspace, homes: list[Path]) -> dict[str, str]: ...

    def close_home(self, workspace: Workspace) -> list[str]: ...

    def command(
        self, argv: list[str], env: dict[str, str], workspace: Workspace, hidden: list[Path]
    ) -> tuple[list[str], dict[str, str]]: ...

    def changed_lines(self, workspace: Workspace) -> int: ...

    def result_bundle(self, workspace: Workspace, target: Path) -> Path | None: ...

    def teardown(self, workspace: Workspace, *, preserve: bool) -> bool: ...


def moved(value: str, mapping: dict[str, str]) -> str:
    """VALUE with its longest leading path in MAPPING replaced by where that went."""
    for source in sorted(mapping, key=len, reverse=True):
        if value == source or value.startswith(source.rstrip("/") + "/"):
            return mapping[source] + value[len(source) :]
    return value


def translated(env: dict[str, str], mapping: dict[str, str]) -> dict[str, str]:
    """ENV with every path in a leased home pointing into the run's copy instead."""
    return {key: moved(value, mapping) for key, value in env.items()}


def outermost(homes: list[Path]) -> list[Path]:
    """HOMES without those inside another (XDG_CONFIG_HOME inside HOME goes with HOME)."""
    unique = list(dict.fromkeys(homes))
    return [h for h in unique if not any(o != h and o in h.parents for o in unique)]


def carry(value: str, workspace: Workspace, hidden: list[Path]) -> str:
    """A file the command names inside a HIDDEN place (a scenario beside the
    configuration) goes into the workspace, as a guest's upload does; VALUE otherwise."""
    path = Path(value)
    if not path.is_absolute() or not path.is_file() or workspace.root in path.parents:
        return value
    if not any(place == path or place in path.parents for place in hidden):
        return value
    folder = workspace.home / "carried"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = folder / f"{len(list(folder.iterdir()))}-{path.name}"
    shutil.copyfile(path, target)
    return str(target)


class LocalBackend:
    """Each provider home the run names is copied into the workspace's private home for
    the run (not a shared parent), adopted back when refreshed, and removed after it."""

    name = "local"

    def __init__(self) -> None:
        self.leases: dict[Path, list[tuple[Path, Path, dict[str, bytes]]]] = {}
        self.read_only: set[Path] = set()  # workspaces whose checkout the job may not change

    def describe(self) -> dict[str, str]:
        return {"backend": self.name}

    def route_model(self, target: str) -> None:
        """A job on this host reaches loopback as it is."""

    def prepare(
        self,
        root: Path,
        bundle: Path,
        base_ref: str,
        inputs: dict[str, str | bytes],
        *,
        read_only: bool = False,
    ) -> Workspace:
        workspace = prepare_workspace(root, bundle, base_ref, inputs, detached=read_only)
        if read_only:
            self.read_only.add(root)
        return workspace

    def altered(self, workspace: Workspace) -> list[str]:
        return altered(workspace)

    def open_home(self, workspace: Workspace, homes: list[Path]) -> dict[str, str]:
        open_private_home(workspace)
        mapping: dict[str, str] = {}
        leases = self.leases.setdefault(workspace.root, [])
        for number, home in enumerate(outermost(homes)):
            if workspace.root in home.parents or home == workspace.root:
                home.mkdir(mode=0o700, parents=True, exist_ok=True)
                continue
            copy = workspace.home / "providers" / f"{number}-{home.name}"
            copy.parent.mkdir(mode=0o700, exist_ok=True)
            copy_home(home, copy)
            leases.append((home, copy, credential_files(home)))
            mapping[str(home)] = str(copy)
        return mapping

    def close_home(self, workspace: Workspace) -> list[str]:
        notes = []
        for source, copy, before in self.leases.pop(workspace.root, []):
            if source.is_dir():
                notes.append(adopt(source, before, credential_files(copy)))
            remove_attempt(copy)
        return notes

    def command(
        self, argv: list[str], env: dict[str, str], workspace: Workspace, hidden: list[Path]
    ) -> tuple[list[str], dict[str, str]]:
        carried = [carry(value, workspace, hidden) for value in argv]
        read_only = workspace.root in self.read_only
        return sandboxed(carried, workspace, [], hidden=hidden, read_only=read_only), env

    def changed_lines(self, workspace: Workspace) -> int:
        return changed_lines(workspace)

    def result_bundle(self, workspace: Workspace, target: Path) -> Path | None:
        return result_bundle(workspace, target)

    def teardown(self, workspace: Workspace, *, preserve: bool) -> bool:
        self.close_home(workspace)
        self.read_only.discard(workspace.root)
        return teardown(workspace, preserve=preserve)
