"""Consistent snapshots of a live SQLite database through SQLite's online backup API."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path
from urllib.parse import quote

from aiworker.errors import InvalidInput
from aiworker.runtime.atomic import new_file
from aiworker.runtime.failpoints import failpoint
from aiworker.store.engine import explained, is_postgresql

COMPANIONS = ("-journal", "-wal", "-shm")  # the files SQLite keeps beside a database


def read_only_uri(path: Path) -> str:
    """PATH as a read-only SQLite URI, every character that means something in a URI
    (`#`, `?`, `%`) escaped: unescaped, `a#b.db` would open (and create) `a`."""
    return f"file:{quote(str(path.absolute()))}?mode=ro"


def backup_sqlite(source: Path, target: Path) -> int:
    """Copy SOURCE to TARGET (which must not exist) as one consistent snapshot.

    The copy is built in a private temp file beside TARGET and linked into
    place, so TARGET either does not exist or is complete. Returns its size.
    """
    try:
        return _backup_sqlite(source, target)
    except sqlite3.OperationalError as exc:
        # A full disk is the target's; anything else (locked too long) the source's.
        full = "full" in str(exc) or "disk i/o" in str(exc).lower()
        named = explained(f"sqlite:///{target if full else source}", exc)
        if named is None:
            raise
        raise named from None


def _backup_sqlite(source: Path, target: Path) -> int:
    with new_file(target, owned=True) as tmp:
        src = sqlite3.connect(read_only_uri(source), uri=True, timeout=30)
        try:
            src.execute("PRAGMA busy_timeout = 30000")
            dst = sqlite3.connect(tmp)
            try:
                # The copy takes on the store's WAL mode; held exclusively it keeps its
                # WAL index in memory, so no shared-memory file is made (on a nearly full
                # disk, mapping one can end the process with SIGBUS).
                dst.execute("PRAGMA locking_mode = EXCLUSIVE")
                failpoint("backup.copying")
                # pages=-1 copies everything in one step under one read snapshot, so
                # concurrent writers in WAL mode neither block it nor restart it.
                src.backup(dst, pages=-1)
                dst.execute("PRAGMA journal_mode = DELETE")
                dst.commit()
            finally:
                dst.close()
        finally:
            src.close()
            for companion in COMPANIONS:  # left by a copy that failed part-way
                Path(f"{tmp}{companion}").unlink(missing_ok=True)
    return target.stat().st_size


def backup_still_sqlite(source: Path, target: Path) -> int:
    """Copy SOURCE, on a file system mounted read-only, to TARGET (which must not exist)
    as one file; its size. Nothing can write the database through this mount, so its
    files as they lie are one consistent state: the database and its write-ahead log are
    copied as they are and the log's commits are folded into the copy (SQLite cannot open
    the database in place: it would make its shared-memory file beside it). Another,
    writable mount of the same disk may still write it: a copy during which either file
    changed is refused."""
    wal = Path(f"{source}-wal")
    before = _looks(source, wal)
    with new_file(target, owned=True) as tmp:
        try:
            shutil.copyfile(source, tmp)  # into new_file's 0600 file
            if wal.exists():
                _copy_private(wal, Path(f"{tmp}-wal"))
            if _looks(source, wal) != before:
                raise InvalidInput(
                    f"{source} changed while it was copied, though this mount of it is "
                    "read-only: it is written through another; back it up there"
                )
            dst = sqlite3.connect(tmp)
            try:
                dst.execute("PRAGMA locking_mode = EXCLUSIVE")  # no shared-memory file
                failpoint("backup.copying")
                dst.execute("PRAGMA journal_mode = DELETE")  # folds the log into the copy
                dst.commit()
            finally:
                dst.close()
        finally:
            for companion in COMPANIONS:
                Path(f"{tmp}{companion}").unlink(missing_ok=True)
    return target.stat().st_size


def _looks(*paths: Path) -> list[tuple[int, int] | None]:
    """Each file's size and modification time (None: absent)."""
    found: list[tuple[int, int] | None] = []
    for path in paths:
        try:
            info = path.stat()
        except FileNotFoundError:
            found.append(None)
        else:
            found.append((info.st_size, info.st_mtime_ns))
    return found


def _copy_private(source: Path, target: Path) -> None:
    """SOURCE's bytes into TARGET, made 0600 (never readable by others meanwhile)."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with open(source, "rb") as reader, os.fdopen(fd, "wb") as writer:
        shutil.copyfileobj(reader, writer)


def snapshot_digests(snapshot: Path) -> set[str]:
    """The payloads a snapshot's artifact records name as present (read-only; a snapshot
    from before the artifact store names none)."""
    db = sqlite3.connect(read_only_uri(snapshot), uri=True)
    try:
        found = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'artifacts'"
        ).fetchone()
        if found is None:
            return set()
        rows = db.execute("SELECT DISTINCT sha256 FROM artifacts WHERE removed_at IS NULL")
        return {str(sha) for (sha,) in rows}
    finally:
        db.close()


class NotASnapshot(Exception):
    """A file that is no intact aiworker database snapshot (the message says why)."""


def snapshot_sha256(snapshot: Path) -> str:
    """The SHA-256 of the snapshot file's bytes: what a backup's payload folder names as
    the snapshot it belongs with."""
    import hashlib

    with snapshot.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def snapshot_revision(snapshot: Path) -> str | None:
    """The schema revision of an intact SQLite snapshot (None: never migrated); raises
    NotASnapshot for a file that is not SQLite or fails SQLite's integrity check."""
    with open(snapshot, "rb") as handle:
        if handle.read(16) != b"SQLite format 3\x00":
            raise NotASnapshot(f"{snapshot} is not a SQLite database")
    db = sqlite3.connect(read_only_uri(snapshot), uri=True)
    try:
        try:
            verdict = db.execute("PRAGMA integrity_check").fetchone()
        except sqlite3.DatabaseError as exc:
            raise NotASnapshot(f"{snapshot} cannot be read: {exc}") from None
        if verdict is None or verdict[0] != "ok":
            raise NotASnapshot(f"{snapshot} fails SQLite's integrity check: {verdict}")
        found = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
        ).fetchone()
        if found is None:
            return None
        row = db.execute("SELECT version_num FROM alembic_version").fetchone()
        return None if row is None else str(row[0])
    finally:
        db.close()


def dump_server(url: str, target: Path) -> tuple[str, int]:
    """The server database at URL dumped to TARGET (new) with its own tool, checked:
    (where it is, the dump's size). Only PostgreSQL is a server here."""
    from aiworker.store import postgresql

    if not is_postgresql(url):
        raise InvalidInput("db backup needs a SQLite file or a PostgreSQL database")
    return postgresql.where(url), postgresql.dump(url, target)
