"""The free-space reserve on a real small file system: a 48 MiB tmpfs as the state
directory, filled until less than `storage.reserve_gib` is free. Doctor warns, a real
tick starts nothing and says why (the task waits, nothing is half-started), and the
next tick after space is freed starts the work."""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest

from tests.delivery_fixtures import write_scenario
from tests.helpers import configure
from tests.test_fault_injection import tick
from tests.test_implement import FIX, query, result_doc

MIB = 1024 * 1024
RESERVE_MIB = 24


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    state = tmp_path / "small"
    state.mkdir(mode=0o700)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48m,mode=0700", "tmpfs", str(state)], check=True
    )
    monkeypatch.setenv("AIWORKER_STATE_DIR", str(state))
    try:
        yield state
    finally:
        subprocess.run(["umount", "--lazy", str(state)], check=False)


@contextlib.contextmanager
def ext4(tmp_path, block: int, mib: int = 16):
    """A real ext4 file system of BLOCK-byte blocks on a loop device, mounted for the block."""
    image, mounted = tmp_path / f"ext4-{block}.img", tmp_path / f"ext4-{block}"
    mounted.mkdir()
    image.write_bytes(b"")
    os.truncate(image, mib * MIB)
    subprocess.run(["mkfs.ext4", "-q", "-m", "0", "-b", str(block), str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mounted)], check=True)
    try:
        yield mounted
    finally:
        subprocess.run(["umount", str(mounted)], check=False)


def free(path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def test_under_the_reserve_doctor_warns_and_no_new_work_starts(
    small_disk, forge, tmp_path, monkeypatch, cli
):
    config = configure(tmp_path, forge, monkeypatch)
    write_scenario(tmp_path / "scenario.json", edits={"calc.py": FIX}, result=result_doc())
    config.write_text(
        '\nproviders = ["script"]\n[provider_options.script]\nscenario = "scenario.json"\n'
        + config.read_text()
        + f"[scheduler]\nfollow_up = false\n[storage]\nreserve_gib = {RESERVE_MIB / 1024}\n"
    )
    assert cli("db", "upgrade").exit_code == 0
    assert cli("poll").exit_code == 0
    db = small_disk / "aiworker.db"
    # Leave 16 MiB: under the 24 MiB reserve.
    filler = small_disk / "filler"
    with open(filler, "wb") as out:
        out.write(b"\0" * (free(small_disk) - 16 * MIB))
    assert free(small_disk) < RESERVE_MIB * MIB

    doctor = cli("--json", "doctor").json()
    [storage] = [c for c in doctor["checks"] if c["name"] == "storage"]
    assert storage["status"] == "warn", storage
    assert "under the reserve of 0.0234375 GiB (storage.reserve_gib)" in storage["detail"]

    held = tick(cli, monkeypatch)
    assert (held["started"], held["delivering"]) == ([], [])
    assert "no new phase or step starts until space is freed" in held["low_space"]
    assert query(db, "select state from tasks") == [("ready",)]
    assert query(db, "select count(*) from attempts") == [(0,)]
    # Said in words too, not only in --json.
    said = cli("scheduler", "tick").stdout
    assert "nothing new started: 0.02 GiB free for" in said, said
    shown = cli("--json", "status").json()["low_space"]
    assert "no new phase or step starts until space is freed" in shown
    assert "Storage: nothing new starts: 0.02 GiB free" in " ".join(cli("status").stdout.split())

    filler.unlink()
    [(ok,)] = [
        (c["status"],) for c in cli("--json", "doctor").json()["checks"] if c["name"] == "storage"
    ]
    assert ok == "ok"
    going = tick(cli, monkeypatch)
    assert going["low_space"] is None
    assert cli("--json", "status").json()["low_space"] is None
    assert [job["task"] for job in going["started"]] == [1]
    assert query(db, "select state from tasks") == [("implemented",)]


def test_doctor_warns_of_a_state_directory_on_blocks_smaller_than_a_page(
    tmp_path, monkeypatch, cli
):
    """SQLite maps its shared memory page by page; on 1 KiB blocks a full disk leaves
    part of a page unbacked and the next command touching it dies with SIGBUS."""
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root")
    assert cli("config", "set", "storage.reserve_gib", "0").exit_code == 0  # a small disk
    with ext4(tmp_path, 1024) as small:
        monkeypatch.setenv("AIWORKER_STATE_DIR", str(small / "state"))
        checks = cli("--json", "doctor").json()["checks"]
        [storage] = [c for c in checks if c["name"] == "storage"]
        assert storage["status"] == "warn", storage
        assert "1024-byte blocks, smaller than the 4096 bytes SQLite" in storage["detail"]
    with ext4(tmp_path, 4096) as fine:
        monkeypatch.setenv("AIWORKER_STATE_DIR", str(fine / "state"))
        checks = cli("--json", "doctor").json()["checks"]
        [storage] = [c for c in checks if c["name"] == "storage"]
        assert storage["status"] == "ok", storage
