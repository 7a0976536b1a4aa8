"""A full disk on a real small file system (a 48 MiB tmpfs as the state directory),
filled while a phase runs, and under a retention pass: the write that fails fails its
step, nothing is reported as succeeded, no record names a missing or partial payload,
and the work goes on once space is back."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.delivery_fixtures import write_scenario
from tests.helpers import configure, run_process
from tests.test_fault_injection import tick
from tests.test_implement import FIX, query, result_doc
from tests.test_retention import _age
from tests.test_storage_reserve import MIB, small_disk  # noqa: F401 - fixture


def _fill(disk: Path) -> Path:
    """Leave no free block: the filler takes what is free, then a little more if any."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * MIB)
                out.flush()
        except OSError:
            pass
        try:
            while True:
                out.write(b"\0" * 4096)
                out.flush()
        except OSError:
            pass
    return filler


def _payloads_named_exist(database: Path, disk: Path) -> None:
    for (sha,) in query(database, "select sha256 from artifacts where removed_at is null"):
        assert (disk / "artifacts" / "sha256" / sha[:2] / sha).is_file(), sha


def test_a_phase_whose_disk_fills_fails_cleanly_and_runs_again_once_space_is_back(
    small_disk,  # noqa: F811
    forge,
    tmp_path,
    monkeypatch,
    cli,
):
    _configured(forge, tmp_path, monkeypatch, cli, sleep_s=3)
    database = small_disk / "aiworker.db"
    assert cli("--json", "claim", "--slot", "1").json()["claimed"]
    job = subprocess.Popen(
        [sys.executable, "-m", "aiworker", "--json", "implement", "--task", "1", "--slot", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while query(database, "select count(*) from attempts") == [(0,)]:
        assert time.monotonic() < deadline
        assert job.poll() is None, job.communicate()
        time.sleep(0.05)
    filler = _fill(small_disk)
    out, err = job.communicate(timeout=120)
    assert job.returncode != 0, out
    assert "No space left on device" in out + err or "disk is full" in out + err
    # Nothing claims success: the task is not implemented, no attempt succeeded, no
    # receipt passed, and every payload a record names is whole where it should be.
    # (Where the phase was when the disk filled decides whether its end could still be
    # recorded: a write that fits in the database's free pages goes through.)
    assert query(database, "select state from tasks") != [("implemented",)]
    assert query(database, "select count(*) from attempts where outcome = 'succeeded'") == [(0,)]
    assert query(database, "select count(*) from receipts") == [(0,)]
    _payloads_named_exist(database, small_disk)
    partial = small_disk / "artifacts" / "partial"
    assert not partial.is_dir() or list(partial.iterdir()) == []

    # While the disk stays full, the tick refuses to start anything new (under the
    # reserve, here none: it is full) or fails as a whole; nothing is started.
    held = run_process("--json", "scheduler", "tick")
    assert held.exit_code != 0 or held.json()["started"] == [], held
    assert query(database, "select count(*) from attempts where outcome = 'succeeded'") == [(0,)]

    # Space back: ticks recover what the full disk left open (a job that could not
    # record its end) and run the phase to the end.
    filler.unlink()
    write_scenario(tmp_path / "scenario.json", edits={"calc.py": FIX}, result=result_doc())
    for _ in range(3):
        tick(cli, monkeypatch)
        if query(database, "select state from tasks") == [("implemented",)]:
            break
    assert query(database, "select state from tasks") == [("implemented",)]
    assert query(database, "select count(*) from attempts where finished_at is null") == [(0,)]
    _payloads_named_exist(database, small_disk)


def _configured(forge, tmp_path, monkeypatch, cli, **scenario) -> None:
    """Issue 1 recorded on the small disk, for the script provider (no reserve: the disk
    itself is the limit)."""
    config = configure(tmp_path, forge, monkeypatch)
    write_scenario(
        tmp_path / "scenario.json", edits={"calc.py": FIX}, result=result_doc(), **scenario
    )
    config.write_text(
        '\nproviders = ["script"]\n[provider_options.script]\nscenario = "scenario.json"\n'
        + config.read_text()
        + "[scheduler]\nfollow_up = false\n[storage]\nreserve_gib = 0\n"
    )
    assert cli("db", "upgrade").exit_code == 0
    assert cli("poll").exit_code == 0


def _implemented(forge, tmp_path, monkeypatch, cli) -> None:
    """Task 1 implemented on the small disk."""
    _configured(forge, tmp_path, monkeypatch, cli)
    assert cli("--json", "claim", "--slot", "1").json()["claimed"]
    assert run_process("implement", "--task", "1", "--slot", "1").exit_code == 0


def test_a_publish_on_a_full_disk_pushes_nothing_and_goes_through_once_space_is_back(
    small_disk,  # noqa: F811
    forge,
    tmp_path,
    monkeypatch,
    cli,
):
    _implemented(forge, tmp_path, monkeypatch, cli)
    database = small_disk / "aiworker.db"
    filler = _fill(small_disk)
    full = run_process("--json", "publish", "--task", "1")
    assert full.exit_code == 75, full
    assert "disk is full" in full.json()["error"]["message"]
    worker = forge.client("worker-bot")
    assert worker.pulls("team", "app", state="all") == []

    filler.unlink()
    assert query(database, "select state from tasks") == [("implemented",)]
    assert query(database, "select count(*) from publications") == [(0,)]
    published = run_process("--json", "publish", "--task", "1")
    assert published.exit_code == 0, published
    assert len(worker.pulls("team", "app", state="all")) == 1
    assert query(database, "select state from tasks") == [("awaiting_ci",)]


def test_a_retention_pass_on_a_full_disk_removes_a_payload_with_its_record_or_neither(
    small_disk,  # noqa: F811
    forge,
    tmp_path,
    monkeypatch,
    cli,
):
    _implemented(forge, tmp_path, monkeypatch, cli)
    assert run_process("task", "cancel", "1").exit_code == 0
    database = small_disk / "aiworker.db"
    # A first pass (nothing expired yet) leaves what every pass keeps: its lock file.
    assert run_process("--json", "retention").json()["removed"] == []
    _age(database, 30)
    named = {sha for (sha,) in query(database, "select sha256 from artifacts")}
    assert named

    filler = _fill(small_disk)
    full = run_process("--json", "retention")
    # Refused as a full disk (exit 75, retried by the next pass), or done where it fit.
    assert full.exit_code in (0, 75), full
    if full.exit_code:
        assert "the disk is full" in full.json()["error"]["message"]
    # Removed with their records marked, or (the write failed) kept with them unmarked.
    for sha in named:
        [(marked,)] = query(
            database, f"select max(removed_at is not null) from artifacts where sha256 = '{sha}'"
        )
        present = (small_disk / "artifacts" / "sha256" / sha[:2] / sha).is_file()
        assert present != bool(marked), (sha, marked, present, full)
    assert not (small_disk / "artifacts" / "trash").is_dir() or not any(
        (small_disk / "artifacts" / "trash").iterdir()
    )

    filler.unlink()
    swept = run_process("--json", "retention")
    assert swept.exit_code == 0, swept
    assert query(database, "select count(*) from artifacts where removed_at is null") == [(0,)]
    assert not [p for p in (small_disk / "artifacts" / "sha256").rglob("*") if p.is_file()]
