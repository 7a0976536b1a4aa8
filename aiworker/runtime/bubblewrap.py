"""Bubblewrap argv for a job on this host: the system read-only, secrets out of sight.

The whole file system is bound read-only where it lies (a checkout or a venv under
/tmp still works), with a private /dev, /proc, IPC and pid namespace and session, and
an empty /run (its sockets would reach the user's and the system's services). HIDDEN places are
empty in there (a directory becomes an empty tmpfs, a file an empty read-only file);
WRITABLE directories are mounted again on top, so one may lie inside a hidden one.
Run by root, the job is an ordinary user (UNPRIVILEGED_UID) of its own user
namespace with no capabilities, and what it writes still belongs to the host user.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

# The user id a root-started job has inside its own user namespace.
UNPRIVILEGED_UID = 1000
# What stays visible under /run: name resolution only.
RUN_KEPT = ("/run/systemd/resolve", "/run/resolvconf")


@dataclass(frozen=True)
class Jail:
    chdir: Path
    tmpdir: Path
    empty: Path  # where the empty stand-in for a hidden file is made (outside WRITABLE views)
    writable: list[Path] = field(default_factory=list)
    hidden: list[Path] = field(default_factory=list)
    read_only: list[Path] = field(default_factory=list)  # bound read-only again, last


def installed() -> str | None:
    return shutil.which("bwrap")


def jailed(argv: list[str], jail: Jail, bwrap: str) -> list[str]:
    """ARGV inside bubblewrap (BWRAP, its path) as JAIL says."""
    user = []
    if os.geteuid() == 0:
        uid = str(UNPRIVILEGED_UID)
        user = ["--unshare-user", "--uid", uid, "--gid", uid]
    # /run holds sockets a read-only bind does not close (connect needs no write): the
    # user's systemd and D-Bus, the system bus, the journal; a job could ask them to act
    # outside the jail. It is an empty tmpfs in there; only the resolver's files (DNS,
    # where /etc/resolv.conf points into /run) are bound back, read-only.
    binds = ["--tmpfs", "/run"]
    for kept in RUN_KEPT:
        if Path(kept).is_dir():
            binds += ["--ro-bind", kept, kept]
    for path in jail.hidden:
        if path.is_dir():
            binds += ["--tmpfs", str(path)]
        elif path.exists():  # a file (a token): an empty one in its place
            jail.empty.touch(mode=0o400, exist_ok=True)
            binds += ["--ro-bind", str(jail.empty), str(path)]
    for path in jail.writable:
        if path.is_dir():
            binds += ["--bind", str(path), str(path)]
    for path in jail.read_only:
        binds += ["--ro-bind", str(path), str(path)]
    return [
        bwrap,
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        *binds,
        "--setenv",
        "TMPDIR",
        str(jail.tmpdir),
        *user,
        "--unshare-pid",
        "--unshare-ipc",
        "--new-session",  # no TIOCSTI into the caller's terminal
        "--die-with-parent",
        "--chdir",
        str(jail.chdir),
        "--",
        *argv,
    ]
