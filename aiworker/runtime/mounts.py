"""File systems mounted inside a tree this process is about to remove.

A build killed part-way (an image recipe's mmdebstrap, say) can leave the host's /proc,
/sys or /dev mounted inside its root filesystem; removing that tree would descend into
them. They are detached first, the deepest first, so that the removal sees only the
tree's own files.
"""

from __future__ import annotations

import re
from pathlib import Path

from aiworker.runtime.processes import run_command

_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo writes space, tab, newline, \ as \ooo


def mounts_below(root: Path) -> list[Path]:
    """The mount points at or under ROOT in this mount namespace, the deepest first."""
    top = str(root.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        point = _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), line.split(" ")[4])
        if point == top or point.startswith(top.rstrip("/") + "/"):
            found.append(Path(point))
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def detach_mounts_below(root: Path) -> list[Path]:
    """Detach (lazily: at once, whatever still uses them) every mount at or under ROOT;
    the mount points that stay (they could not be detached).

    Each is made a slave first: a recursive bind of a shared tree (the host's /sys, /dev)
    is a peer of the host's mounts, and unmounting a peer would unmount the host's too."""
    points = mounts_below(root)
    tops = [p for p in points if not any(q in p.parents for q in points)]
    for top in tops:
        run_command(["mount", "--make-rslave", str(top)], timeout=30)
    for top in tops:
        run_command(["umount", "--recursive", "--lazy", str(top)], timeout=30)
    return mounts_below(root)
