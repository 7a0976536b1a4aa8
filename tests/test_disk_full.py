"""A full disk on a real small file system (a 48 MiB tmpfs as the state directory),
filled while a phase runs, and under a retention pass: the write that fails fails its
step, nothing is reported as succeeded, no record names a missing or partial payload,
and the work goes on once space is back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.delivery_fixtures import write_scenario
from tests.helpers import configure, run_process
from tests.test_fault_injection import tick
from tests.test_implement import FIX, query, result_doc
from tests.test_retention import _age
from tests.test_storage_reserve import MIB, ext4, small_disk  # noqa: F401 - fixture


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


def test_a_phase_whose_disk_fills_after_its_run_is_held_and_runs_again_once_resumed(
    small_disk,  # noqa: F811
    forge,
    tmp_path,
    monkeypatch,
    cli,
):
    """The disk fills while the provider runs (its work committed): the job cannot keep
    its result, so the attempt is closed (what it left removed first, to make room for
    the record), refunded, and the task held for the operator, since a run whose own output
    filled the disk would spend inference again at every retry. Once space is back and
    the task resumed, it runs to the end."""
    _configured(forge, tmp_path, monkeypatch, cli, sleep_s=5)
    database = small_disk / "aiworker.db"
    assert cli("--json", "claim", "--slot", "1").json()["claimed"]
    job = subprocess.Popen(
        [sys.executable, "-m", "aiworker", "--json", "implement", "--task", "1", "--slot", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not _committed(database):  # the provider ran and committed: it sleeps now
        assert time.monotonic() < deadline
        assert job.poll() is None, job.communicate()
        time.sleep(0.05)
    filler = _fill(small_disk)
    out, err = job.communicate(timeout=120)
    assert job.returncode == 75, (out, err)
    assert "No space left on device" in out + err or "disk is full" in out + err
    # Nothing claims success, nothing is charged, nothing is left open or on disk.
    assert query(database, "select state, claim_slot from tasks") == [("paused", None)]
    [(data,)] = query(database, "select data from events where kind = 'task.held'")
    reason = json.loads(data)["reason"]
    assert "held until an operator fixes it and runs `aiworker task resume 1`" in reason
    rows = query(database, "select outcome, refunded, finished_at is not null from attempts")
    assert rows == [("unavailable", 1, 1)]
    assert not list((small_disk / "workspaces").iterdir())
    assert query(database, "select count(*) from receipts") == [(0,)]
    _payloads_named_exist(database, small_disk)
    partial = small_disk / "artifacts" / "partial"
    assert not partial.is_dir() or list(partial.iterdir()) == []

    # Space back, the task stays held: a tick starts nothing until the operator resumes.
    filler.unlink()
    assert tick(cli, monkeypatch)["started"] == []
    assert query(database, "select state from tasks") == [("paused",)]
    assert cli("--json", "task", "resume", "1").exit_code == 0
    write_scenario(tmp_path / "scenario.json", edits={"calc.py": FIX}, result=result_doc())
    tick(cli, monkeypatch)
    assert query(database, "select state from tasks") == [("implemented",)]
    assert query(database, "select count(*) from attempts where finished_at is null") == [(0,)]
    _payloads_named_exist(database, small_disk)


def test_a_cancel_on_a_full_disk_still_stops_the_job_and_says_its_record_waits(
    small_disk,  # noqa: F811
    forge,
    tmp_path,
    monkeypatch,
    cli,
):
    """The disk is full while a job runs: the cancel cannot be recorded, but the job is
    stopped all the same, and the refusal (exit 75) says so and what to run once there
    is space; run then, the cancel is recorded and nothing of the job is left open."""
    _configured(forge, tmp_path, monkeypatch, cli)
    database = small_disk / "aiworker.db"
    assert cli("--json", "claim", "--slot", "1").json()["claimed"]
    job = subprocess.Popen(
        [sys.executable, "-m", "aiworker", "implement", "--task", "1", "--slot", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "AIWORKER_FAILPOINT": "implementation.after_run:hang"},
    )
    try:
        deadline = time.monotonic() + 120
        while not _committed(database):  # the provider ran; the job hangs after it
            assert time.monotonic() < deadline
            assert job.poll() is None
            time.sleep(0.05)
        filler = _fill(small_disk)
        refused = run_process("--json", "task", "cancel", "1")
        assert refused.exit_code == 75, refused
        message = refused.json()["error"]["message"]
        assert f"task 1's job was stopped (pids {job.pid}" in message, message
        assert "run `aiworker task cancel 1` again once there is space" in message
        job.wait(timeout=60)
    finally:
        job.kill()
        job.wait()
    filler.unlink()
    cancelled = run_process("--json", "task", "cancel", "1")
    assert cancelled.exit_code == 0, cancelled
    assert query(database, "select state from tasks") == [("cancelled",)]
    assert query(database, "select count(*) from attempts where finished_at is null") == [(0,)]


def _committed(database: Path) -> bool:
    """The attempt's workspace holds the provider's commit."""
    rows = query(database, "select workspace_path from attempts where workspace_path is not null")
    if not rows:
        return False
    log = subprocess.run(
        ["git", "-C", f"{rows[0][0]}/repo", "log", "--format=%s"],
        capture_output=True,
        text=True,
        check=False,
    )
    return "Apply scripted changes" in log.stdout


def test_a_full_disk_is_named_as_such_by_every_command_not_as_a_damaged_store(
    small_disk,  # noqa: F811
    forge,
    tmp_path,
    monkeypatch,
    cli,
):
    """A command on a full disk leaves the store's shared-memory file as short as it could
    write it; every later command that reads the store meets SQLite's I/O error for it,
    which is the full disk (exit 75, free space), not a database to restore."""
    _configured(forge, tmp_path, monkeypatch, cli)
    filler = _fill(small_disk)
    for argv in (("status",), ("task", "show", "1"), ("scheduler", "tick"), ("doctor",)):
        done = run_process("--json", *argv)
        text = done.stdout + done.stderr
        assert "not a usable aiworker database" not in text, (argv, done)
        if argv != ("doctor",):
            assert done.exit_code == 75, (argv, done)
            assert "the disk is full" in done.json()["error"]["message"], (argv, done)
    # A file that cannot be written names itself (a write into an open file names none).
    paused = run_process("--json", "scheduler", "pause")
    assert paused.exit_code == 75, paused
    assert str(small_disk) in paused.json()["error"]["message"], paused
    filler.unlink()
    assert run_process("--json", "task", "show", "1").exit_code == 0


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


def test_a_backup_that_runs_out_of_room_leaves_nothing_behind(
    small_disk,  # noqa: F811
    forge,
    tmp_path,
    monkeypatch,
    cli,
):
    """A snapshot whose target disk has room for part of it fails as a full disk (exit
    75), and leaves no part of the copy, nor the files SQLite keeps beside one."""
    _implemented(forge, tmp_path, monkeypatch, cli)
    size = (small_disk / "aiworker.db").stat().st_size
    # ext4 in 4 KiB blocks, as an installation's disk (a tmpfs never failed this way).
    with ext4(tmp_path, 4096) as target:
        filler = _fill(target)
        for free in range(size // 2, size + 64 * 1024, 32 * 1024):
            os.truncate(filler, 0)
            _fill(target)
            os.truncate(filler, filler.stat().st_size - free)
            done = run_process("--json", "db", "backup", "--to", str(target / "b.db"))
            assert done.exit_code in (0, 75), (free, done)
            if done.exit_code:
                assert "the disk is full" in done.json()["error"]["message"], (free, done)
            left = sorted(p.name for p in target.glob("*b.db*"))
            assert left == (["b.db"] if done.exit_code == 0 else []), (free, left)
            (target / "b.db").unlink(missing_ok=True)


def test_a_restore_that_runs_out_of_room_can_simply_be_run_again(
    small_disk,  # noqa: F811
    forge,
    tmp_path,
    monkeypatch,
    cli,
):
    """A restore that fails on a full disk says so (exit 75) and leaves the directory as
    empty as it found it, but for its lock files: the same command, once space is freed,
    restores."""
    _implemented(forge, tmp_path, monkeypatch, cli)
    snapshot, folder = tmp_path / "backup.db", tmp_path / "backup-artifacts"
    made = run_process(
        "--json", "db", "backup", "--to", str(snapshot), "--with-artifacts", str(folder)
    )
    assert made.exit_code == 0, made
    target = small_disk / "restored"
    filler = _fill(small_disk)
    os.truncate(filler, filler.stat().st_size - snapshot.stat().st_size // 2)
    argv = ("--state-dir", str(target), "--json", "restore", "--from", str(snapshot))
    argv += ("--artifacts", str(folder))
    full = run_process(*argv)
    assert full.exit_code == 75, full
    assert "the disk is full" in full.json()["error"]["message"]
    assert [p.name for p in target.iterdir()] == ["locks"]  # its lock files stay
    filler.unlink()
    again = run_process(*argv)
    assert again.exit_code == 0, again
    assert not (target / "restore.incomplete").exists()


def test_a_workspace_that_cannot_grow_is_a_full_disk_and_costs_no_attempt(
    small_disk,  # noqa: F811
    forge,
    tmp_path,
    monkeypatch,
    cli,
):
    """A phase whose workspace cannot be made on a nearly full disk fails as a full disk,
    exit 75, before any inference: what the workspace took is given back, its attempt is
    closed refunded, and the task waits where it retries (the next tick's recovery lands
    it when even that record found no room), without one attempt charged."""
    _configured(forge, tmp_path, monkeypatch, cli)
    database = small_disk / "aiworker.db"
    assert cli("--json", "claim", "--slot", "1").json()["claimed"]
    filler = _fill(small_disk)
    os.truncate(filler, filler.stat().st_size - 256 * 1024)
    full = run_process("--json", "implement", "--task", "1", "--slot", "1")
    assert full.exit_code == 75, full
    assert "workspace" in full.json()["error"]["message"]
    assert "the disk is full" in full.json()["error"]["message"]
    assert not list((small_disk / "workspaces").iterdir())
    rows = query(database, "select outcome, refunded, finished_at is not null from attempts")
    assert rows == [("unavailable", 1, 1)], full.stderr[-3000:]

    filler.unlink()
    assert cli("scheduler", "pause").exit_code == 0
    tick(cli, monkeypatch)
    assert query(database, "select state, claim_slot from tasks") == [("ready", None)]
    rows = query(database, "select outcome, refunded from attempts")
    assert rows == [("unavailable", 1)]  # recovery charged nothing more


def test_a_cancel_of_a_plan_on_a_full_disk_stops_its_milestone_s_job(
    small_disk,  # noqa: F811
    forge,
    tmp_path,
    monkeypatch,
    cli,
):
    """The disk is full while a plan's milestone runs: cancelling the plan cannot be
    recorded, but the milestone's job is stopped all the same, and the refusal names it;
    run again once there is space, the plan and its milestones are cancelled."""
    from tests.test_lifecycle import attempt_tag, wait_for, wait_for_provider
    from tests.test_plan import first_milestone_running

    assert cli("db", "upgrade").exit_code == 0
    database = small_disk / "aiworker.db"
    job = first_milestone_running(forge, database, tmp_path, monkeypatch, cli)
    try:
        [attempt] = wait_for(database, "select id from attempts where task_id = 2")
        wait_for_provider(attempt_tag(small_disk, attempt))  # sleeping out its 600 s
        filler = _fill(small_disk)
        refused = run_process("--json", "task", "cancel", "1")
        assert refused.exit_code == 75, refused
        message = refused.json()["error"]["message"]
        assert f"task 2's job was stopped (pids {job.pid}" in message, message
        assert "run `aiworker task cancel 1` again once there is space" in message
        job.communicate(timeout=60)  # stopped, not left to sleep out its 600 s
    finally:
        job.kill()
        job.communicate()
    filler.unlink()
    cancelled = run_process("--json", "task", "cancel", "1")
    assert cancelled.exit_code == 0, cancelled
    states = query(database, "select id, state from tasks order by id")
    assert states == [(1, "cancelled"), (2, "cancelled"), (3, "cancelled")]
    assert query(database, "select count(*) from attempts where finished_at is null") == [(0,)]
