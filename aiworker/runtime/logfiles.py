"""Log files that stay bounded: rotated by size when a writer opens one.

`scheduler.log` and `task-N.log` are appended to by many short-lived processes. Each
opening first rotates a file past its limit: `x.log` becomes `x.log.1`, `x.log.1`
becomes `x.log.2`, ..., and the oldest beyond the kept count goes. The rotation holds
an flock on the file, so two openers never rotate twice; a process still writing to
the renamed file goes on into `x.log.1`, which is bounded by the next rotation.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Rotation:
    max_bytes: int
    keep: int  # rotated files kept beside the live one


def rotate(path: Path, rotation: Rotation) -> bool:
    """Rotate PATH if it has grown past the limit; True when it was rotated."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # Another opener may have rotated it while we waited: PATH is then a new file.
        try:
            current = os.stat(path)
        except FileNotFoundError:
            return False
        if current.st_ino != os.fstat(fd).st_ino or current.st_size <= rotation.max_bytes:
            return False
        for number in range(rotation.keep, 0, -1):
            older = path.with_name(f"{path.name}.{number}")
            if number == rotation.keep:
                older.unlink(missing_ok=True)
            else:
                newer = path.with_name(f"{path.name}.{number + 1}")
                if older.exists():
                    older.rename(newer)
        if rotation.keep:
            path.rename(path.with_name(f"{path.name}.1"))
        else:
            path.unlink()
        return True
    finally:
        os.close(fd)
