"""What every core operation works against: a state directory and a configuration."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aiworker.config.loader import LoadedConfig
from aiworker.errors import LockHeld, StateUnusable, Unavailable
from aiworker.runtime.atomic import write_private_file
from aiworker.runtime.locks import FileLock, LockDir

if TYPE_CHECKING:
    from aiworker.store.engine import Database


# How long a job waits for a database server that is down or restarting (a tick or a
# command waits for none): its finished work outlasts a restart.
JOB_OUTAGE_WAIT_S = 120.0
# What an installation leaves in its state directory besides its database.
USED_BY_AN_INSTALLATION = ("controller-instance", "git-cache", "attempts", "artifacts")


@dataclass(frozen=True)
class Environment:
    state_dir: Path
    loaded: LoadedConfig

    @property
    def database_url(self) -> str:
        # The store (SQLAlchemy) is imported by what opens it, not by every command.
        from aiworker.store.engine import default_url

        return self.loaded.config.database.url or default_url(self.state_dir)

    @property
    def controller_id(self) -> str:
        """This host among the controllers sharing the database (controller.id)."""
        return self.loaded.config.controller.id or socket.gethostname()

    @property
    def controller_instance(self) -> str:
        """Which installation this controller is, as 'KEY WHERE': a key made once in its
        state directory joined with the machine id (compared: two installations using one
        controller.id differ in it, a renamed host or a moved state directory keeps it),
        then its host and state directory (shown)."""
        path = self.state_dir / "controller-instance"
        # Made by the first command that may write here (the tick makes its state
        # directory first); a reader of a state directory it may not write has none.
        if not path.exists() and os.access(self.state_dir, os.W_OK):
            with contextlib.suppress(FileExistsError):  # another process made it first
                write_private_file(path, secrets.token_hex(8).encode(), replace=False)
        try:
            key = path.read_text(encoding="ascii").strip() or "none"
        except (OSError, UnicodeDecodeError):
            key = "none"
        try:
            machine = Path("/etc/machine-id").read_text(encoding="ascii").strip()[:12]
        except (OSError, UnicodeDecodeError):
            machine = ""
        where = f"{socket.gethostname()}:{self.state_dir.resolve()}"
        return f"{key}.{machine or 'unknown'} {where}"

    @property
    def locks(self) -> LockDir:
        return LockDir(self.state_dir)

    def for_the_forge(self, text: str) -> str:
        """TEXT as the forge may show it: this controller's state directory (where its
        files are, in either spelling) named, not spelled out; only where it stands as a
        path of its own, never inside a URL or a longer name."""
        spellings = {str(self.state_dir.resolve()), str(self.state_dir.absolute())} - {"/"}
        for path in sorted(spellings, key=len, reverse=True):  # one inside the other: it first
            own = re.compile(rf"(?<![\w.:/~-]){re.escape(path)}(?=/|[^\w.~-]|$)")
            text = own.sub("<state directory>", text)
        return text

    def attempt_tag(self, phase: str, attempt_id: int) -> str:
        """AIWORKER_ATTEMPT_ID of a phase attempt's processes: unique to this state directory,
        so recovery and cancel never touch another installation's processes on the host."""
        digest = hashlib.sha256(str(self.state_dir.absolute()).encode()).hexdigest()[:12]
        return f"{phase}-{attempt_id}-{digest}"

    def ensure_state_dir(self) -> Path:
        path = self.state_dir
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:
            raise StateUnusable(f"state directory {path} exists and is not a directory") from None
        except OSError as exc:
            raise StateUnusable(
                f"state directory {path} cannot be created: {exc.strerror}"
            ) from None
        if on_a_read_only_mount(path):
            raise StateUnusable(
                f"state directory {path} is on a read-only file system; nothing was written: "
                "remount it read-write, or use another --state-dir (`aiworker db backup "
                "--to PATH` still copies its database, to another file system)"
            )
        if not os.access(path, os.W_OK | os.X_OK):
            raise StateUnusable(f"state directory {path} is not writable by this user")
        _owned_by_this_user(path)
        if path.stat().st_mode & 0o077 and not any(path.iterdir()):
            path.chmod(0o700)  # made empty for it (`mkdir`, a restore's target): private
        return path

    def ensure_restored(self) -> None:
        """Refuse a state directory that a restore began and did not finish: until its
        check against the forge is done, nothing may start or migrate there."""
        if (self.state_dir / RESTORING).exists():
            raise Unavailable(
                f"a restore into {self.state_dir} did not finish ({RESTORING} is there): "
                "nothing was checked against the forge; remove the directory and restore again"
            )

    def open_database(self, *, require_current: bool = True, patience: float = 0.0) -> Database:
        """Open the store; by default refuse a schema that is missing, older or newer. A
        file that is not a database, or is newer than this code, is refused before
        anything is written to it. PATIENCE: seconds a server that is down is waited for,
        from the first look on (a job's)."""
        from aiworker.store.engine import Database, default_url, sqlite_path
        from aiworker.store.schema import ensure_current, not_initialised, probe_file

        path = sqlite_path(self.database_url)
        if self.database_url == default_url(self.state_dir):
            if require_current and not self.state_dir.exists():
                raise not_initialised(self.database_url)  # a mistyped path: nothing made
            self.ensure_state_dir()
            self.ensure_restored()
        if path is not None and path.exists():
            probe_file(path)
        elif path is not None and require_current:
            # Said before anything is made for it: no empty database, no instance key.
            used = [n for n in USED_BY_AN_INSTALLATION if (self.state_dir / n).exists()]
            if used:
                raise StateUnusable(
                    f"database {path} is missing, yet state directory {self.state_dir} was "
                    f"used (it holds {', '.join(used)}): the tasks, and the pull requests "
                    "they opened, are known to that database alone. Restore it (`aiworker "
                    "restore --from BACKUP` into an empty state directory); `aiworker db "
                    "upgrade` would start an empty one, which knows none of them"
                )
            raise not_initialised(self.database_url)
        lease = self.loaded.config.controller_lease
        db = Database(self.database_url, host=self.controller_id, lease_s=lease)
        db.patience = patience
        if require_current:
            try:
                db.await_server()
                ensure_current(db)
            except BaseException:
                db.dispose()
                raise
        if require_current:  # its key is made once the store may be used: not by a reader
            db.instance = self.controller_instance  # of an old one (doctor, `db current`)
        return db


def on_a_read_only_mount(path: Path) -> bool:
    """PATH lies on a file system mounted read-only (as the kernel remounts a failing
    disk): nothing can write there."""
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def task_log(env: Environment, task_id: int) -> Path:
    """The task's own log, which every job of it appends to (cleanup removes it with the
    task)."""
    return env.state_dir / "logs" / f"task-{task_id}.log"


# Written by restore before it copies anything, removed once its check is done.
RESTORING = "restore.incomplete"
_TASK_FILE = re.compile(r"^task-(\d+)[-.]")
# Where a task's files lie: workspaces, attempts' kept files (prompt, result, output).
TASK_FOLDERS = ("workspaces", "attempts")


def task_artifacts(state_dir: Path, task_id: int) -> list[Path]:
    """What TASK_ID has on disk: workspaces, kept attempt files, its log (rotated too)."""
    found = []
    for name in TASK_FOLDERS:
        folder = state_dir / name
        found += [*folder.glob(f"task-{task_id}-*")] if folder.is_dir() else []
    logs = state_dir / "logs"
    found += [p for p in (logs / f"task-{task_id}.log",) if p.exists()]
    found += [*logs.glob(f"task-{task_id}.log.*")] if logs.is_dir() else []  # rotated
    return sorted(found)


def tasks_with_artifacts(state_dir: Path) -> set[int]:
    """Tasks that have anything on disk, from two directory listings (no database)."""
    ids: set[int] = set()
    for folder in (*(state_dir / name for name in TASK_FOLDERS), state_dir / "logs"):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        ids.update(int(m.group(1)) for m in map(_TASK_FILE.match, names) if m)
    return ids


def hold_job_lock(env: Environment, name: str) -> FileLock | None:
    """Hold lock NAME for this job: recovery reads a free lock as a dead job. Returns the
    lock when it was taken now (an operator ran the step by hand; release it at the end),
    None when it was inherited from the scheduler (it goes with this process)."""
    lock = env.locks.lock(name)
    inherited = lock.is_locked() and lock.holder_pid() == os.getpid()
    if inherited:
        return None
    if not lock.try_acquire():
        holder = lock.holder_pid()
        raise LockHeld(f"lock {name!r} is held by pid {holder}; that job is still running")
    return lock


def state_dir_mode(path: Path) -> int | None:
    try:
        return os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        return None


def _login(uid: int) -> str | None:
    import pwd  # only for this refusal: a tick pays nothing for it

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _owned_by_this_user(path: Path) -> None:
    """Refuse a state directory another user owns: what this user made there (0600 files,
    0700 directories, locks) would shut its owner, the service, out; root may write there,
    and did."""
    owner, me = path.stat().st_uid, os.geteuid()
    if owner == me:
        return
    name, mine = _login(owner), _login(me)
    run_as = f"sudo -u {name}" if name else f"sudo -u '#{owner}'"
    raise StateUnusable(
        f"state directory {path} belongs to {_shown(name, owner)}, and this runs as "
        f"{_shown(mine, me)}: what it made there would shut its owner out; nothing was "
        f"written: run it as its owner ({run_as} aiworker ...)"
    )


def _shown(login: str | None, uid: int) -> str:
    return f"{login} (uid {uid})" if login else f"uid {uid}"
