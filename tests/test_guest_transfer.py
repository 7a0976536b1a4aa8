"""Files from a real guest (QEMU, TCG here) come into the artifact store under the
digest the guest named: when the connection breaks in the middle (the guest's SFTP
server killed), a new login goes on from the bytes already received, and only whole,
verified bytes are published; a link or a file over the bound is refused."""

from __future__ import annotations

import hashlib
import os

import pytest

from aiworker.runtime.artifact_files import CHUNK, ArtifactFiles
from aiworker.runtime.guests.egress import DecisionLog, EgressPolicy, EgressProxy
from aiworker.runtime.guests.guest import Guest, StartOptions
from aiworker.runtime.guests.images import ImageStore
from aiworker.runtime.guests.machine import MachineSpec
from aiworker.runtime.guests.transfer import fetch_verified
from aiworker.runtime.workspace import WorkspaceError

pytestmark = pytest.mark.slow

SIZE = 5_000_000


def test_a_file_from_a_guest_goes_on_after_a_broken_connection_and_is_published_verified(
    guests_dir, tmp_path
):
    store = ImageStore(guests_dir)
    image = store.current()
    assert image is not None
    proxy = EgressProxy(EgressPolicy(hosts=()), DecisionLog(tmp_path / "egress.jsonl", "test"))
    machine = MachineSpec(**image.manifest()["machine"])
    guest = Guest.start(store, image, StartOptions("transfer", proxy.port, machine))
    try:
        assert guest.shell is not None
        guest.shell.check(f"head -c {SIZE} /dev/urandom > /root/out.bin", timeout=120)
        named = guest.shell.check("sha256sum < /root/out.bin").split()[0].decode()
        files = ArtifactFiles(tmp_path / "artifacts")
        broken_at: list[int] = []

        def progress(held: int) -> None:
            if not broken_at:  # after the first chunk is kept: the transfer's server dies
                broken_at.append(held)
                assert guest.shell is not None
                guest.shell.check("pkill -KILL -x sftp-server")

        first_login = guest.shell
        digest, size = fetch_verified(guest, "/root/out.bin", files, 1 << 30, progress)
        assert (digest, size) == (named, SIZE)
        assert broken_at == [CHUNK]
        assert guest.shell is not first_login  # logged in again, and went on
        assert hashlib.sha256(files.read(digest)).hexdigest() == named
        assert os.listdir(tmp_path / "artifacts" / "partial") == []
        # The same file again: already held, nothing is sent.
        assert fetch_verified(guest, "/root/out.bin", files, 1 << 30, progress) == (named, SIZE)

        guest.shell.check("ln -s /etc/shadow /root/link")
        with pytest.raises(WorkspaceError, match="not a regular file"):
            fetch_verified(guest, "/root/link", files, 1 << 30)
        other = ArtifactFiles(tmp_path / "other")
        with pytest.raises(WorkspaceError, match="over 1000"):
            fetch_verified(guest, "/root/out.bin", other, 1000)
        assert (other.received(named), other.has(named)) == (0, False)  # nothing came
        with pytest.raises(WorkspaceError, match="not a regular file"):
            fetch_verified(guest, "/root/missing", other, 1 << 30)
    finally:
        guest.stop()
        proxy.close()
