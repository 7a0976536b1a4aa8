"""The free-space reserve of the state directory's file system (`storage.reserve_gib`):
below it the tick starts no new phase or delivery step, so a filling disk stops new
work before a write fails half-way; recovery and cleanup (which frees space) go on."""

from __future__ import annotations

import os
from pathlib import Path

from aiworker.core.context import Environment
from aiworker.core.health import Check
from aiworker.store.engine import sqlite_path

GIB = 1024**3
MIB = 1024**2
FLOOR = 8 * MIB  # with no reserve configured: full, for a step's records
SHM_PAGE = 4096  # SQLite writes a byte every this many to back its shared memory


def _stats(path: Path) -> os.statvfs_result:
    """The file system of PATH, or of its nearest existing parent (a state directory not
    made yet)."""
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return os.statvfs(probe)


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the file system of PATH."""
    stats = _stats(path)
    return stats.f_bavail * stats.f_frsize


def block_size(path: Path) -> int:
    return _stats(path).f_bsize


def space_shortage(env: Environment, free: int | None = None) -> str | None:
    """Why no new work may start for lack of space (FREE bytes, read when not given), or
    None when the reserve holds. Without a reserve, a nearly full file system (under
    FLOOR) still starts nothing: a step needs room to record how it ended."""
    reserve = env.loaded.config.storage.reserve_gib
    free = free_bytes(env.state_dir) if free is None else free
    if reserve <= 0:
        if free >= FLOOR:
            return None
        return (
            f"{free / MIB:.1f} MiB free for {env.state_dir}: the file system is full; no new "
            "phase or step starts until space is freed"
        )
    if free >= reserve * GIB:
        return None
    return (
        f"{free / GIB:.2f} GiB free for {env.state_dir}, under the reserve of {reserve:g} GiB "
        "(storage.reserve_gib): no new phase or step starts until space is freed"
    )


def storage_check(env: Environment) -> Check:
    free = free_bytes(env.state_dir)
    shortage = space_shortage(env, free)
    if shortage is not None:
        return Check("storage", "warn", shortage)
    block = block_size(env.state_dir)
    if block < SHM_PAGE and sqlite_path(env.database_url) is not None:
        return Check(
            "storage",
            "warn",
            f"{env.state_dir} is on a file system of {block}-byte blocks, smaller than the "
            f"{SHM_PAGE} bytes SQLite backs its shared memory by: when it fills, the store's "
            "shared memory can end any command with SIGBUS; keep it on one of 4 KiB blocks "
            "(mkfs.ext4 -b 4096)",
        )
    reserve = env.loaded.config.storage.reserve_gib
    kept = f"reserve {reserve:g} GiB" if reserve > 0 else "no reserve configured"
    return Check("storage", "ok", f"{free / GIB:.2f} GiB free for {env.state_dir} ({kept})")
