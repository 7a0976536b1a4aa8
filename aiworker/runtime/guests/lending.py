"""Lending the provider's logins to a guest for one run, and taking them back.

The homes are copied into a tmpfs only once nothing of the unprivileged user runs (after
dependency setup); when the run ends, every process of that user is killed first, the
credential files are read back (regular files only, bounded) and a refreshed login is
adopted on the host only when it names the same account; then the tmpfs is removed.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from aiworker.runtime.credentials import adopt, credential_files, is_credential
from aiworker.runtime.guests.ssh import GuestShell
from aiworker.runtime.workspace import outermost

# Root-owned (under /run, which `dev` cannot write): root never works on a path the
# unprivileged user could have replaced with a link.
CREDS = "/run/aiworker-creds"
MAX_CREDENTIAL_BYTES = 1 << 20
# Every process of the unprivileged user, killed (and gone) before root touches what
# they could write: after dependency setup, after the provider, before files come back.
KILL_DEV = (
    "pkill -KILL -u dev; for i in $(seq 1 100); do pgrep -u dev >/dev/null || exit 0; "
    "sleep 0.05; done; exit 1"
)
# (the host's home, where it went in the guest, its credential files when lent)
Lease = tuple[Path, str, dict[str, bytes]]


def lend_homes(
    shell: GuestShell, workspace_root: Path, homes: list[Path]
) -> tuple[list[Lease], dict[str, str]]:
    """Copy HOMES (those outside the workspace) into the guest's tmpfs; the leases, and
    where each home went."""
    shell.check(KILL_DEV, timeout=30)
    shell.check(
        f"mkdir -m 0700 {CREDS} && "
        f"mount -t tmpfs -o size=256m,mode=0700,uid=1000,gid=1000 tmpfs {CREDS}"
    )
    leases: list[Lease] = []
    leased = {}
    for number, home in enumerate(outermost(homes)):
        if workspace_root in home.parents or home == workspace_root:
            continue
        target = f"{CREDS}/{number}-{home.name}"
        files = (
            [p for p in home.rglob("*") if p.is_file() and not p.is_symlink()]
            if home.is_dir()
            else []
        )
        folders = {str(Path(target, p.relative_to(home)).parent) for p in files}
        shell.check(f"mkdir -p {shlex.join(sorted({target, *folders}))}")
        for path in files:
            shell.put(path, f"{target}/{path.relative_to(home)}")
        shell.check(f"chown -R dev:dev {shlex.quote(target)}")
        leases.append((home, target, credential_files(home)))
        leased[str(home)] = target
    return leases, leased


def take_back(shell: GuestShell, leases: list[Lease]) -> list[str]:
    """Stop the run, adopt refreshed logins of the same account, remove the tmpfs."""
    shell.check(KILL_DEV, timeout=30)  # nothing of the run changes files now
    notes = []
    for source, target, before in leases:
        after = _credentials(shell, target)
        if source.is_dir():
            notes.append(adopt(source, before, after))
    shell.run(f"umount {CREDS}; rm -rf {CREDS}")
    return notes


def _credentials(shell: GuestShell, target: str) -> dict[str, bytes]:
    """The credential files under TARGET: regular files only (no links), bounded."""
    listing = shell.run(
        f"cd {shlex.quote(target)} && find . -type f -size -{MAX_CREDENTIAL_BYTES // 1024}k -print0"
    )
    found = {}
    with shell.sftp() as sftp:
        for name in listing.stdout.split(b"\0"):
            relative = name.decode(errors="replace").removeprefix("./")
            if not relative or not is_credential(relative):
                continue
            with sftp.open(f"{target}/{relative}", "rb") as handle:
                data = handle.read(MAX_CREDENTIAL_BYTES + 1)
            if len(data) <= MAX_CREDENTIAL_BYTES:
                found[relative] = data
    return found
