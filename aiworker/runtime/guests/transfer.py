"""A file from a guest into the artifact store: the guest names its size and SHA-256
first, then the bytes come over SFTP from what the store already holds of that digest.
A connection that breaks in the middle (sshd or its SFTP server killed, a reset) is
logged in again with the pinned host key and the transfer goes on from the bytes
received; the payload is published only whole and hashing to the digest the guest
named, so nothing half-sent or altered is ever handed on. Bytes the store already holds
are still read from the guest and hashed: naming a digest proves nothing."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shlex
import time
from collections.abc import Callable, Iterator

from aiworker.runtime.artifact_files import CHUNK, ArtifactDamaged, ArtifactFiles, is_digest
from aiworker.runtime.failpoints import failpoint
from aiworker.runtime.guests.guest import Guest
from aiworker.runtime.guests.ssh import STALL_S, GuestUnreachable
from aiworker.runtime.workspace import WorkspaceError

log = logging.getLogger(__name__)
RECONNECTS = 5
# Called after each chunk is kept, with the bytes held so far (progress, and the tests'
# hook to break the connection at a known point).
Progress = Callable[[int], None]


def describe(guest: Guest, remote: str, limit: int) -> tuple[str, int]:
    """REMOTE's SHA-256 and size, once it is a regular file of at most LIMIT bytes."""
    assert guest.shell is not None
    path = shlex.quote(remote)
    done = guest.shell.run(
        f"test -f {path} && test ! -L {path} && stat -c %s {path} && sha256sum < {path}",
        timeout=600,
    )
    lines = done.stdout.decode(errors="replace").split()
    if not done.ok or len(lines) < 2 or not lines[0].isdigit() or not is_digest(lines[1]):
        raise WorkspaceError(f"{remote} in the guest is not a regular file")
    size = int(lines[0])
    if size > limit:
        raise WorkspaceError(f"{remote} in the guest is {size} bytes, over {limit}")
    return lines[1], size


def fetch_verified(
    guest: Guest,
    remote: str,
    files: ArtifactFiles,
    limit: int,
    progress: Progress | None = None,
) -> tuple[str, int]:
    """REMOTE into FILES under its digest; returns (digest, size). GuestUnreachable when
    the guest stays away after RECONNECTS new logins, or its bytes do not match twice."""
    digest, size = describe(guest, remote, limit)
    if files.has(digest):
        _prove(guest, remote, digest, size)  # naming a digest is not holding its bytes
        return digest, size
    breaks = damaged = 0
    while not files.has(digest):
        try:
            _copy(guest, remote, files, (digest, size), progress)
        except ArtifactDamaged as exc:
            damaged += 1
            if damaged > 1:
                raise GuestUnreachable(f"{remote} from the guest: {exc}") from None
        except ValueError:  # another transfer of the same bytes moved on: look again
            breaks += 1
            if breaks > RECONNECTS:
                raise
        except _Broken as exc:
            breaks += 1
            if breaks > RECONNECTS:
                raise GuestUnreachable(f"{remote} from the guest: {exc}") from None
            log.warning(
                "the transfer of %s broke at byte %d (%s); going on from there",
                remote,
                files.received(digest),
                exc,
            )
            time.sleep(min(0.2 * 2**breaks, 5))
            guest.reconnect()
    return digest, size


def _prove(guest: Guest, remote: str, digest: str, size: int) -> None:
    """The guest's REMOTE is the SIZE bytes hashing to DIGEST that the store already holds:
    read and hashed here, kept nowhere (a broken connection is logged in again, as a
    transfer's is). Else GuestUnreachable."""
    for breaks in range(RECONNECTS + 1):
        try:
            if _hashed(guest, remote, size) == (size, digest):
                return
            raise GuestUnreachable(f"{remote} from the guest is not the file it described")
        except _Broken as exc:
            if breaks == RECONNECTS:
                raise GuestUnreachable(f"{remote} from the guest: {exc}") from None
            time.sleep(min(0.2 * 2**breaks, 5))
            guest.reconnect()


def _hashed(guest: Guest, remote: str, size: int) -> tuple[int, str]:
    """How many bytes REMOTE holds (reading stops past SIZE) and their SHA-256."""
    assert guest.shell is not None
    hashed, held = hashlib.sha256(), 0
    with _broken_as():
        sftp = guest.shell.open_sftp(STALL_S)
        try:
            with sftp.open(remote, "rb") as handle:
                while held <= size and (chunk := handle.read(CHUNK)):
                    hashed.update(chunk)
                    held += len(chunk)
        finally:
            with contextlib.suppress(Exception):
                sftp.close()
    return held, hashed.hexdigest()


class _Broken(Exception):
    """The connection broke in the middle of a transfer."""


def _copy(
    guest: Guest,
    remote: str,
    files: ArtifactFiles,
    described: tuple[str, int],
    progress: Progress | None,
) -> None:
    digest, size = described
    held = files.received(digest)
    if held > size:  # not this file's bytes: dropped (ArtifactDamaged), start again
        files.complete(digest, held)
    assert guest.shell is not None
    with _broken_as():
        sftp = guest.shell.open_sftp(STALL_S)  # a stalled guest is a broken connection
    try:
        with _broken_as():
            handle = sftp.open(remote, "rb")
            handle.seek(held)
        while held < size:
            with _broken_as():
                chunk = handle.read(min(CHUNK, size - held))
            if not chunk:
                raise _Broken(f"the file ended at byte {held} of {size}")
            held = files.receive(digest, held, chunk)  # a full disk here is no break
            failpoint("guest_transfer.after_chunk")  # the tests' phase killed mid-transfer
            if progress is not None:
                progress(held)
    finally:
        with contextlib.suppress(Exception):
            sftp.close()
    files.complete(digest, size)


@contextlib.contextmanager
def _broken_as() -> Iterator[None]:
    """What a broken SSH connection raises (paramiko's errors, EOF, a closed socket), as
    _Broken; anything else (this host's own errors) as it is."""
    import paramiko

    try:
        yield
    except _Broken:
        raise
    except (FileNotFoundError, PermissionError) as exc:  # the guest's answer, not a break
        raise WorkspaceError(f"the guest refused the file: {exc}") from None
    except (paramiko.SSHException, paramiko.SFTPError, EOFError, OSError) as exc:
        raise _Broken(str(exc) or type(exc).__name__) from None
