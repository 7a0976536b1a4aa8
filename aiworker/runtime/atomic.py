"""Crash-safe file writes: private temp file, fsync, rename, fsync of the directory."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from aiworker.runtime.processes import process_alive

log = logging.getLogger(__name__)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def new_file(target: Path, *, owned: bool = False) -> Iterator[Path]:
    """A private (0600) temporary file beside TARGET to build it in. When the block ends
    without an error it is synced and linked into place as TARGET (which must not exist:
    FileExistsError); it is removed either way, so TARGET is absent or complete. OWNED:
    its name carries this process's pid, so that what a SIGKILL left behind is known for
    a leftover by sweep_abandoned (a large file, in a folder nothing else cleans)."""
    prefix = f".{target.name}.{_owner()}." if owned else f".{target.name}."
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.link(tmp, target)
        fsync_directory(target.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _owner() -> str:
    """This process as the name of a file it makes says: its host and its pid (a folder
    may be shared with other hosts, whose pids mean nothing here)."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64] or "host"
    return f"{host}-pid{os.getpid()}"


_OWNED = re.compile(
    r"^\..+\.(?P<host>[A-Za-z0-9-]+)-pid(?P<pid>\d+)\.[^.]+\.tmp(-journal|-wal|-shm)?$"
)


def sweep_abandoned(folder: Path) -> list[Path]:
    """Remove the temporary files of new_file(owned=True) in FOLDER that a process of this
    host made and that no longer runs (killed before it could remove them); the paths
    removed. One that cannot be removed is left, and logged."""
    here = _owner().rpartition("-pid")[0]
    removed = []
    for path in folder.glob(".*.tmp*"):
        match = _OWNED.match(path.name)
        if match is None or match["host"] != here or process_alive(int(match["pid"])):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("cannot remove %s, left by a killed process: %s", path, exc.strerror)
            continue
        removed.append(path)
    return removed


def write_private_file(path: Path, data: bytes, *, replace: bool = True) -> None:
    """Write DATA to PATH as a 0600 file; readers see the old or the new file, never a mix.

    With replace=False an existing PATH is an error (FileExistsError) and is left alone.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            tmp.unlink()
        fsync_directory(path.parent)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if isinstance(exc, OSError) and exc.filename is None:
            # A write into the open file names none: say which file could not be written.
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise


def private_directory(path: Path) -> Path:
    """PATH as a directory only its owner may enter (made if missing, narrowed if wider):
    a provider's home holds its credentials. Each missing folder above it is made 0700
    too (the state directory itself, when a provider's home is the first thing in it)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def copy_private(source: Path, target: Path) -> None:
    """SOURCE's bytes to a new 0600 file TARGET (replacing one there), streamed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(source, "rb") as src, os.fdopen(os.open(target, flags, 0o600), "wb") as out:
        os.fchmod(out.fileno(), 0o600)
        while block := src.read(1 << 20):
            out.write(block)
