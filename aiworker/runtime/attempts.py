"""Attempt directories: private, uniquely named, filled by copying, always removed.

Copying never follows a symbolic link: links are recreated as links, special
files are skipped, and the copy stops with SourceTooLarge at the file or byte
limit. Removal never follows links either and copes with read-only trees.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from aiworker.runtime.reaper import signal_all, tagged_processes

log = logging.getLogger(__name__)
MARKER = ".aiworker-attempt.json"
DEFAULT_MAX_FILES = 100_000
DEFAULT_MAX_BYTES = 4 * 1024**3


class SourceTooLarge(Exception):
    pass


@dataclass(frozen=True)
class Attempt:
    attempt_id: str
    path: Path

    @property
    def workspace(self) -> Path:
        return self.path / "workspace"


@dataclass
class CopyCounts:
    files: int = 0
    directories: int = 0
    symlinks: int = 0
    skipped_special: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class Removal:
    removed: bool
    entries: int
    duration_ms: int
    error: str | None


def default_attempt_root() -> Path:
    return Path(tempfile.gettempdir()) / "aiworker" / "attempts"


def ensure_private_root(root: Path) -> Path:
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = root.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"attempt root {root} is not a directory")
    if info.st_uid != os.getuid():
        raise PermissionError(f"attempt root {root} belongs to another user")
    return root


def create_attempt(root: Path) -> Attempt:
    ensure_private_root(root)
    path = Path(tempfile.mkdtemp(prefix="attempt-", dir=root))
    attempt_id = path.name.removeprefix("attempt-")
    marker = {"attempt_id": attempt_id, "pid": os.getpid(), "created": time.time()}
    try:
        (path / MARKER).write_text(json.dumps(marker), encoding="utf-8")
        os.chmod(path / MARKER, 0o600)
        (path / "workspace").mkdir(mode=0o700)
    except BaseException:  # a full disk, say: no half-made attempt is left behind
        shutil.rmtree(path, ignore_errors=True)
        raise
    return Attempt(attempt_id, path)


def copy_tree(source: Path, target: Path, max_files: int, max_bytes: int) -> CopyCounts:
    """Copy SOURCE's contents into the existing directory TARGET."""
    counts = CopyCounts()
    pending = [(source, target)]
    while pending:
        src_dir, dst_dir = pending.pop()
        with os.scandir(src_dir) as entries:
            for entry in entries:
                dst = Path(dst_dir, entry.name)
                info = entry.stat(follow_symlinks=False)
                mode = info.st_mode
                if stat.S_ISLNK(mode):
                    os.symlink(os.readlink(entry.path), dst)
                    counts.symlinks += 1
                elif stat.S_ISDIR(mode):
                    os.mkdir(dst, 0o700)
                    counts.directories += 1
                    pending.append((Path(entry.path), dst))
                elif stat.S_ISREG(mode):
                    counts.files += 1
                    counts.bytes += info.st_size
                    if counts.files > max_files:
                        raise SourceTooLarge(f"source has more than {max_files} files")
                    if counts.bytes > max_bytes:
                        raise SourceTooLarge(f"source has more than {max_bytes} bytes")
                    _copy_file(entry.path, dst, stat.S_IMODE(mode))
                else:
                    counts.skipped_special += 1
        # Directory modes last, so a read-only source directory can still be filled.
        os.chmod(dst_dir, stat.S_IMODE(os.lstat(src_dir).st_mode) | 0o700)
    return counts


def _copy_file(src: str, dst: Path, mode: int) -> None:
    src_fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dst_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(src_fd).st_size
            copied = 0
            while copied < size:
                sent = os.sendfile(dst_fd, src_fd, None, min(size - copied, 1 << 30))
                if sent == 0:
                    break
                copied += sent
            os.fchmod(dst_fd, mode)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def remove_attempt(path: Path) -> Removal:
    """Remove an attempt directory without following links, read-only trees included."""
    started = time.monotonic()
    entries = 0
    error = None
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink()
            entries = 1
        else:
            entries = remove_tree(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc.strerror or exc}"
    duration = int((time.monotonic() - started) * 1000)
    return Removal(not os.path.lexists(path), entries, duration, error)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_directory(name: str, parent: int | None) -> int:
    """Open a directory for listing without following a link, made owner-rwx first: an
    O_PATH descriptor needs no read permission, and chmod through it cannot be redirected
    to a link's target (it names this very directory)."""
    handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
    try:
        with contextlib.suppress(OSError):
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
        return os.open(".", _DIRECTORY, dir_fd=handle)
    finally:
        os.close(handle)


def remove_tree(root: Path) -> int:
    """Remove ROOT and everything under it, however deep, with no recursion and no link
    followed; return how many entries went.

    It walks down by directory descriptors (openat with O_NOFOLLOW) and back up through
    "..", so it holds two descriptors whatever the depth and never builds a path longer
    than one name: a tree 100,000 levels deep goes like a flat one."""
    removed = 0
    names: list[str] = []  # the way down from ROOT, one name per level
    above: list[tuple[int, int]] = []  # (device, inode) of each directory on the way down
    fd = _open_directory(str(root), None)
    try:
        while True:
            child = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        child = entry.name
                        break
                    os.unlink(entry.name, dir_fd=fd)
                    removed += 1
            if child is not None:
                down = _open_directory(child, fd)
                here = os.fstat(fd)
                os.close(fd)
                fd, names = down, [*names, child]
                above.append((here.st_dev, here.st_ino))
                continue
            if not names:
                break
            up = os.open("..", _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = up
            landed = os.fstat(fd)
            if (landed.st_dev, landed.st_ino) != above.pop():
                # Someone moved a directory while the walk was inside it: stop here
                # rather than remove whatever the way up now leads to.
                raise OSError(errno.ESTALE, "the tree moved while it was being removed")
            os.rmdir(names.pop(), dir_fd=fd)
            removed += 1
    finally:
        os.close(fd)
    os.rmdir(root)
    return removed + 1


def sweep_stale_attempts(root: Path) -> int:
    """Remove attempt directories left by runners that died; live ones are kept.

    Only real directories owned by this user with a readable marker are candidates: a
    link named like an attempt, a file, or anything else is skipped (and logged), and one
    that cannot be removed never stops the run that found it."""
    removed = 0
    if not root.is_dir():
        return 0
    for path in root.glob("attempt-*"):
        try:
            info = path.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                log.warning("attempt root: skipped %s (not an attempt directory of ours)", path)
                continue
            marker = json.loads(_read_marker(path))
            pid = int(marker["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        # A job runs as this user and could plant a directory here: its marker must name
        # its own directory, or its tag would pick another job's processes to kill.
        if marker.get("attempt_id") != path.name.removeprefix("attempt-"):
            log.warning("attempt root: skipped %s (its marker names another attempt)", path)
            continue
        if pid == os.getpid() or _alive(pid):
            continue
        # What the dead runner's job left running (it carries the attempt's tag) goes too.
        tag = f"AIWORKER_ATTEMPT_ID={marker.get('attempt_id', '')}".encode()
        signal_all(tagged_processes(tag), signal.SIGKILL)
        removal = remove_attempt(path)
        if removal.removed:
            removed += 1
        else:
            log.warning("attempt root: could not remove %s: %s", path, removal.error)
    return removed


def _read_marker(path: Path) -> str:
    """The marker file, opened without following a link at either level; anything but a
    regular file is refused."""
    directory = os.open(path, _DIRECTORY)
    try:
        # Never blocks: a FIFO planted as a marker would hold every later sweep forever.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        fd = os.open(MARKER, flags, dir_fd=directory)
    finally:
        os.close(directory)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path / MARKER} is not a file")
        handle = os.fdopen(fd, encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        return handle.read(65536)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
