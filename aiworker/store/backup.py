"""Consistent snapshots of a live SQLite database through SQLite's online backup API."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from pathlib import Path

from aiworker.runtime.atomic import fsync_directory


def backup_sqlite(source: Path, target: Path) -> int:
    """Copy SOURCE to TARGET (which must not exist) as one consistent snapshot.

    The copy is built in a private temp file beside TARGET and linked into
    place, so TARGET either does not exist or is complete. Returns its size.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, 0o600)
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
        try:
            src.execute("PRAGMA busy_timeout = 30000")
            dst = sqlite3.connect(tmp)
            try:
                # pages=-1 copies everything in one step under one read snapshot, so
                # concurrent writers in WAL mode neither block it nor restart it.
                src.backup(dst, pages=-1)
                dst.execute("PRAGMA journal_mode = DELETE")
                dst.commit()
            finally:
                dst.close()
        finally:
            src.close()
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.link(tmp, target)
        fsync_directory(target.parent)
        return target.stat().st_size
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
