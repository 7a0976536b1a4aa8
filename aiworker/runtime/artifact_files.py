"""The artifact store's files: private, content-addressed payloads under
$STATE_DIR/artifacts/sha256/ab/abcdef..., named by the SHA-256 of their bytes.

A payload is written under a temporary name in partial/, fsynced, hashed back from
the disk and only then linked into place (and the directory fsynced), so a name in
sha256/ always holds exactly the bytes its digest says. A transfer that arrives in
pieces (a guest's or a runner's upload) appends to partial/DIGEST.part from what was
already received, and is published only whole and verified. Nothing here knows the
database: store/artifacts.py records which task, attempt or job refers to a payload,
and a record is written only after the payload is in place (core/evidence/artifacts.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from aiworker.runtime.atomic import fsync_directory

DIGEST = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20
# Touched by each retention pass (core/maintenance/retention.py); the tick reads its age.
RETENTION_STAMP = ".last-retention-pass"


class ArtifactDamaged(Exception):
    """A payload's bytes do not hash to its name."""


def is_digest(text: str) -> bool:
    return bool(DIGEST.match(text))


def _hash_file(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            sha.update(block)
    return sha.hexdigest()


class ArtifactFiles:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _folder(self, name: str) -> Path:
        folder = self.root / name
        if not folder.is_dir():
            for path in (self.root, folder):
                path.mkdir(mode=0o700, exist_ok=True)
        return folder

    def path(self, digest: str) -> Path:
        if not is_digest(digest):
            raise ValueError(f"{digest!r} is not a SHA-256 digest")
        return self.root / "sha256" / digest[:2] / digest

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def put(self, data: bytes) -> tuple[str, int]:
        """Store DATA; returns its digest and size. Storing the same bytes twice keeps one."""
        digest = hashlib.sha256(data).hexdigest()
        self._write_new(digest, lambda handle: handle.write(data))
        return digest, len(data)

    def put_file(self, source: Path) -> tuple[str, int]:
        """Store SOURCE's bytes, streamed (a bundle may be large); its digest and size.
        A file that changes while it is copied is refused (ArtifactDamaged)."""
        digest = _hash_file(source)

        def copy(handle: BinaryIO) -> None:
            with open(source, "rb") as data:
                while block := data.read(CHUNK):
                    handle.write(block)

        self._write_new(digest, copy)
        return digest, source.stat().st_size

    def _write_new(self, digest: str, write: Callable[[BinaryIO], object]) -> None:
        """Unless DIGEST is held: WRITE its bytes under a temporary name, fsync, publish."""
        if self.has(digest):
            return
        fd, name = tempfile.mkstemp(prefix=f"{digest}.", dir=self._folder("partial"))
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as handle:
                write(handle)
                handle.flush()
                os.fsync(handle.fileno())
            self._publish(tmp, digest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    # A transfer in pieces: what was received survives an interrupted sender and a
    # restarted receiver; the sender asks `received` and goes on from there.
    def _part(self, digest: str) -> Path:
        self.path(digest)  # validates the name
        return self._folder("partial") / f"{digest}.part"

    def received(self, digest: str) -> int:
        """Bytes of DIGEST already held: its whole size once published, else the part's."""
        if self.has(digest):
            return self.path(digest).stat().st_size
        part = self._part(digest)
        return part.stat().st_size if part.exists() else 0

    def receive(self, digest: str, offset: int, chunk: bytes) -> int:
        """Append CHUNK at OFFSET (which must be what is already held); returns the new
        size. A chunk that starts elsewhere is refused (ValueError) and changes nothing."""
        part = self._part(digest)
        with open(part, "ab") as handle:
            # Two senders of the same bytes (two jobs printing the same) take turns.
            fcntl.flock(handle, fcntl.LOCK_EX)
            if self.has(digest) or os.fstat(handle.fileno()).st_nlink != 1:
                # Published meanwhile: the part opened is the payload now (or a new empty
                # one made after it went), and nothing more is added to it.
                self._drop_if_empty(part, handle.fileno())
                raise ValueError(f"{digest[:12]} is complete; nothing more is taken")
            held = handle.seek(0, os.SEEK_END)
            if offset != held:
                raise ValueError(f"chunk at byte {offset}, but {held} bytes are held")
            handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
            return handle.tell()

    def _drop_if_empty(self, part: Path, fd: int) -> None:
        info = os.fstat(fd)
        with contextlib.suppress(FileNotFoundError):
            if info.st_size == 0 and os.stat(part).st_ino == info.st_ino:
                part.unlink()

    def drop_part(self, digest: str) -> None:
        """Forget what was received of DIGEST (bytes that cannot be its own)."""
        part = self._part(digest)
        with contextlib.suppress(FileNotFoundError), open(part, "rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                if os.stat(part).st_ino == os.fstat(handle.fileno()).st_ino:
                    part.unlink()

    def complete(self, digest: str, size: int) -> None:
        """Publish the part of DIGEST once it holds SIZE bytes that hash to DIGEST; a part
        that does not is removed (ArtifactDamaged) so the sender starts again."""
        if self.has(digest):
            return
        part = self._part(digest)
        try:
            handle = open(part, "rb")  # noqa: SIM115 (held for its lock)
        except FileNotFoundError:
            raise ValueError(f"0 of {size} bytes of {digest[:12]} are held") from None
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            if self.has(digest):  # the other sender published it meanwhile
                part.unlink(missing_ok=True)
                return
            held = os.fstat(handle.fileno()).st_size
            if held != size:
                raise ValueError(f"{held} of {size} bytes of {digest[:12]} are held")
            try:
                self._publish(part, digest)
            except ArtifactDamaged:
                part.unlink(missing_ok=True)
                raise
            part.unlink(missing_ok=True)

    def _publish(self, tmp: Path, digest: str) -> None:
        actual = _hash_file(tmp)
        if actual != digest:
            raise ArtifactDamaged(f"received bytes hash to {actual}, not {digest}")
        os.chmod(tmp, 0o400)
        target = self.path(digest)
        shelf = self._folder("sha256")
        target.parent.mkdir(mode=0o700, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, target)
        fsync_directory(target.parent)
        fsync_directory(shelf)

    def read(self, digest: str) -> bytes:
        """DIGEST's bytes, verified; FileNotFoundError when absent, ArtifactDamaged when
        they no longer hash to their name."""
        data = self.path(digest).read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise ArtifactDamaged(f"artifact {digest} no longer matches its digest")
        return data

    # Removal in two steps, so a removal whose records could not be written is undone:
    # `discard` moves the payload aside (one rename, inside the caller's transaction),
    # `purge` frees it once that transaction committed, `undiscard` puts it back.
    def discard(self, digest: str) -> int:
        """Move DIGEST's payload aside; returns its size (0 when it was not there)."""
        path = self.path(digest)
        aside = self._folder("trash") / digest
        try:
            size = path.stat().st_size
            os.rename(path, aside)
        except FileNotFoundError:
            return 0
        fsync_directory(path.parent)
        return size

    def undiscard(self, digest: str) -> None:
        aside = self.root / "trash" / digest
        target = self.path(digest)
        with contextlib.suppress(FileNotFoundError):
            if target.exists():  # stored again meanwhile: the same bytes
                aside.unlink()
            else:
                os.rename(aside, target)
                fsync_directory(target.parent)

    def purge(self, digest: str) -> None:
        self.path(digest)  # validates the name
        (self.root / "trash" / digest).unlink(missing_ok=True)

    def discarded(self) -> list[str]:
        """Payloads moved aside by a removal that did not finish (a crash between)."""
        folder = self.root / "trash"
        return sorted(n for n in os.listdir(folder) if is_digest(n)) if folder.is_dir() else []

    def usage(self) -> tuple[int, int]:
        """How many payloads the store holds and their bytes (parts not counted)."""
        count = total = 0
        shelf = self.root / "sha256"
        for folder, _dirs, files in os.walk(shelf):
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    total += os.lstat(os.path.join(folder, name)).st_size
                    count += 1
        return count, total

    def written_before(self, before: float) -> list[str]:
        """Payloads last written before BEFORE (a timestamp): the ones the retention pass
        checks for a record naming them."""
        found = []
        for folder, _dirs, names in os.walk(self.root / "sha256"):
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    if is_digest(name) and os.lstat(os.path.join(folder, name)).st_mtime < before:
                        found.append(name)
        return found

    def stale_parts(self, older_than_s: float, now: float | None = None) -> list[Path]:
        """Transfers nobody has added to for OLDER_THAN_S seconds."""
        folder = self.root / "partial"
        if not folder.is_dir():
            return []
        limit = (now if now is not None else time.time()) - older_than_s
        return sorted(p for p in folder.iterdir() if p.is_file() and p.stat().st_mtime < limit)
