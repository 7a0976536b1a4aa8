"""Named kernel flock locks under $STATE_DIR/locks/.

The kernel releases a flock when its holder dies, so a free lock always means
nobody holds it. The holder writes its pid into the file; the pid never decides
who holds the lock, only whether a held lock is worth a short wait: a process
the holder forked shares its descriptor from the fork until it execs (the
descriptor is close-on-exec) or exits, so for a moment after the holder was
killed the lock can still be held by such a child. A lock whose recorded holder
no longer runs is therefore waited for, up to SETTLE_SECONDS, before it is
reported held: a job killed a moment ago is seen dead by the next claim, never
alive because of a child it forked in its last instant.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from aiworker.errors import InvalidInput, LockHeld
from aiworker.runtime.processes import process_alive

_LOCK_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_POLL_SECONDS = 0.01
SETTLE_SECONDS = 2.0  # a child between fork and exec lets go in far less
MAINTENANCE_WAIT_S = 30.0  # a tick, which holds maintenance.lock shared, ends sooner


class FileLock:
    """An exclusive flock on one file (or, taken with try_share, a shared one). Not
    reentrant; one holder per instance."""

    def __init__(self, path: Path, *, description: str | None = None) -> None:
        self.path = path
        self.description = description or path.name
        self._fd: int | None = None
        self._shared = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never waits for a holder that still runs."""
        return self._settled(self._take)

    def try_share(self) -> bool:
        """Take the lock shared, beside any other sharer, if no one holds it exclusively:
        while any sharer holds it, no exclusive holder can take it. A sharer records no
        pid (sharers would overwrite each other's)."""
        if self._settled(functools.partial(self._take, shared=True)):
            self._shared = True
            return True
        return False

    def _take(self, *, shared: bool = False) -> bool:
        if self._fd is not None:
            raise RuntimeError(f"{self.description} is already held by this process")
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        if shared:  # no one holds it exclusively: a pid there is a dead holder's
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            return True
        os.ftruncate(fd, 0)
        # Who holds it is for people reading status; a full disk keeps the lock held
        # and names no holder.
        with contextlib.suppress(OSError):
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return True

    def acquire(self, timeout: float | None = None) -> None:
        """Wait up to TIMEOUT seconds (None: forever); raise LockHeld when it runs out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = _POLL_SECONDS
        while not self.try_acquire():
            if deadline is not None and time.monotonic() >= deadline:
                holder = self.holder_pid()
                who = f" by pid {holder}" if holder else ""
                raise LockHeld(f"{self.description} is held{who}; try again later")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        # Unlock before close so a waiter never sees our stale pid as the holder (a
        # sharer wrote none, and must not erase the pid of one that waits to take it).
        if not self._shared:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
        self._shared = False
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    @property
    def fileno(self) -> int:
        if self._fd is None:
            raise RuntimeError(f"{self.description} is not held")
        return self._fd

    def hand_over(self, pid: int) -> None:
        """Leave the lock to PID, which inherited our descriptor: record it and let go of
        ours without unlocking (an unlock would release the lock the child holds too)."""
        if self._fd is None:
            raise RuntimeError(f"{self.description} is not held")
        fd, self._fd = self._fd, None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{pid}\n".encode(), 0)
        os.close(fd)

    def is_locked(self) -> bool:
        """True when some process (possibly this one) holds the lock now, exclusively (or
        this one, shared)."""
        if self._fd is not None:
            return True
        return not self._settled(self._free)

    def _free(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
        return True

    def _settled(self, attempt: Callable[[], bool]) -> bool:
        """ATTEMPT (take the lock, or see it free); while it fails only because the
        recorded holder's forked children still let go, try again up to SETTLE_SECONDS."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while not attempt():
            if not self._holder_gone() or time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_SECONDS)
        return True

    def _holder_gone(self) -> bool:
        """The pid the holder recorded no longer runs (None recorded: a holder between
        taking the lock and writing its pid, alive)."""
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return False
        return text.isdigit() and not process_alive(int(text))

    def holder_pid(self) -> int | None:
        """The pid the holder recorded, if the lock is held and the record is readable."""
        if self._fd is None and self._free():
            return None
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return int(text) if text.isdigit() else None

    def __enter__(self) -> FileLock:
        if not self.try_acquire():
            holder = self.holder_pid()
            who = f" by pid {holder}" if holder else ""
            raise LockHeld(f"{self.description} is held{who}; try again later")
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


class LockDir:
    """The named locks of one state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "locks"

    def lock(self, name: str) -> FileLock:
        if not _LOCK_NAME.match(name):
            raise InvalidInput(f"invalid lock name {name!r}")
        return FileLock(self.root / f"{name}.lock", description=f"lock {name!r}")

    def slot(self, number: int) -> FileLock:
        return self.lock(f"slot-{number}")

    def working(self) -> list[str]:
        """The slots and tasks whose lock a job holds now ("slot 1", "task 7"): work that
        runs, or was handed its lock and has not recorded an attempt yet."""
        found = []
        for path in sorted(self.root.glob("*.lock")):
            kind, _, number = path.stem.partition("-")
            if kind in ("slot", "task") and number.isdigit() and self.lock(path.stem).is_locked():
                found.append(f"{kind} {number}")
        return found

    def maintenance(self) -> FileLock:
        """maintenance.lock, taken exclusively: no tick starts work until it is released.
        A tick holds it shared while it runs, and is waited for (up to MAINTENANCE_WAIT_S);
        another maintenance operation holds it exclusively, and is not."""
        lock = self.lock("maintenance")
        deadline = time.monotonic() + MAINTENANCE_WAIT_S
        while not lock.try_acquire():
            if lock.is_locked():
                raise LockHeld("another maintenance operation holds maintenance.lock; try later")
            if time.monotonic() >= deadline:
                raise LockHeld(
                    f"a tick has held maintenance.lock for over {MAINTENANCE_WAIT_S:g} s; try later"
                )
            time.sleep(_POLL_SECONDS * 10)
        return lock

    @contextlib.contextmanager
    def held(self, name: str, timeout: float | None = 0) -> Iterator[FileLock]:
        lock = self.lock(name)
        if timeout == 0:
            lock.__enter__()
        else:
            lock.acquire(timeout)
        try:
            yield lock
        finally:
            lock.release()
