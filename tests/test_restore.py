"""Backup with artifacts, restore into an empty state directory, and the check against
the forge that decides, per task, whether it carries on or is held."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time

from tests.forge_fixtures import git
from tests.helpers import run_process
from tests.json_keys import assert_keys
from tests.test_delivery import deliver_until, delivered  # noqa: F401 - fixture
from tests.test_implement import query


def _backup(tmp_path):
    snapshot, folder = tmp_path / "backup.db", tmp_path / "backup-artifacts"
    made = run_process(
        "--json", "db", "backup", "--to", str(snapshot), "--with-artifacts", str(folder)
    )
    assert made.exit_code == 0, made
    assert_keys("db backup", made.json())
    return snapshot, folder, made.json()


def _restore(target, snapshot, folder=None):
    extra = ["--artifacts", str(folder)] if folder else []
    return run_process(
        "--state-dir", str(target), "--json", "restore", "--from", str(snapshot), *extra
    )


def test_a_task_the_forge_agrees_with_carries_on_after_a_restore_with_its_artifacts(
    delivered,  # noqa: F811
    upgraded,
    state_dir,
    tmp_path,
):
    task, _head = delivered()
    reports = deliver_until(task, "publish", "ci")
    assert [r.exit_code for r in reports.values()] == [0, 0], reports
    snapshot, folder, made = _backup(tmp_path)
    named = {sha for (sha,) in query(upgraded, "select sha256 from artifacts")}
    assert made["artifacts"]["payloads"] == len(named)
    assert (made["artifacts"]["missing"], made["artifacts"]["damaged"]) == ([], [])
    for sha in named:
        copy = folder / "sha256" / sha[:2] / sha
        assert hashlib.sha256(copy.read_bytes()).hexdigest() == sha

    target = tmp_path / "restored"
    target.mkdir()
    target.chmod(0o755)  # made empty for it by the operator, as mkdir makes it
    restored = _restore(target, snapshot, folder)
    assert restored.exit_code == 0, restored
    report = restored.json()
    assert_keys("restore", report)
    assert report["artifacts"]["payloads"] == len(named)
    assert report["tasks"] == [
        {
            "task": task,
            "state": "awaiting_review",
            "outcome": "carries on",
            "reason": "the forge agrees with the record",
        }
    ]
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert stat.S_IMODE((target / "aiworker.db").stat().st_mode) == 0o600
    here = ["--state-dir", str(target)]
    shown = run_process(*here, "--json", "status").json()
    assert shown["artifacts"]["payloads"] == len(named)
    assert shown["tasks"]["awaiting_review"] == 1
    # The restored installation delivers the task: review and merge on its own state.
    for step in ("review", "merge"):
        done = run_process(*here, "--json", step, "--task", str(task))
        assert done.exit_code == 0, (step, done)
    assert query(target / "aiworker.db", "select state from tasks") == [("done",)]
    # The original was left as it was.
    assert query(upgraded, "select state from tasks") == [("awaiting_review",)]


def test_a_task_whose_pr_moved_after_the_backup_is_held_until_an_operator_resumes_it(
    delivered,  # noqa: F811
    upgraded,
    tmp_path,
    forge,
):
    task, head = delivered()
    reports = deliver_until(task, "publish", "ci")
    assert [r.exit_code for r in reports.values()] == [0, 0], reports
    snapshot, folder, _made = _backup(tmp_path)
    # Work after the backup: a commit on the PR's branch.
    branch = reports["publish"].json()["branch"]
    clone = tmp_path / "clone"
    git("clone", "-q", "--branch", branch, str(forge.data / "git" / "team" / "app.git"), str(clone))
    (clone / "later.txt").write_text("after the backup\n")
    git("add", "later.txt", cwd=clone)
    git("commit", "-qm", "after the backup", cwd=clone)
    git("push", "-q", "origin", branch, cwd=clone)
    moved = git("rev-parse", "HEAD", cwd=clone).stdout.strip()

    target = tmp_path / "restored"
    restored = _restore(target, snapshot, folder)
    assert restored.exit_code == 0, restored
    [verdict] = restored.json()["tasks"]
    assert verdict["outcome"] == "held"
    assert moved in verdict["reason"]
    assert head in verdict["reason"]
    here = ["--state-dir", str(target)]
    assert query(target / "aiworker.db", "select state from tasks") == [("paused",)]
    # A poll that finds the issue authorised does not take a held task back.
    assert run_process(*here, "poll").exit_code == 0
    assert query(target / "aiworker.db", "select state from tasks") == [("paused",)]
    shown = run_process(*here, "--json", "task", "show", str(task)).json()
    assert shown["history"][-1]["kind"] == "task.held"
    resumed = run_process(*here, "--json", "task", "resume", str(task))
    assert resumed.exit_code == 0, resumed
    assert_keys("task resume", resumed.json())
    assert resumed.json() == {"task": task, "state": "awaiting_review", "was": "paused"}
    again = run_process(*here, "--json", "task", "resume", str(task))
    assert again.exit_code == 1
    assert "only a paused task" in again.json()["error"]["message"]


def test_a_restore_without_the_artifacts_keeps_their_records_marked_removed(
    delivered,  # noqa: F811
    upgraded,
    tmp_path,
):
    task, head = delivered()
    snapshot, _folder, _made = _backup(tmp_path)
    target = tmp_path / "restored"
    restored = _restore(target, snapshot)
    assert restored.exit_code == 0, restored
    named = {sha for (sha,) in query(upgraded, "select sha256 from artifacts")}
    assert set(restored.json()["artifacts"]["missing"]) == named
    # Implemented on the old host and never pushed: its head went with that git cache.
    [verdict] = restored.json()["tasks"]
    assert (verdict["task"], verdict["outcome"]) == (task, "held")
    assert f"its head {head} is on no branch of the forge" in verdict["reason"]
    rows = query(target / "aiworker.db", "select removed_at is not null from artifacts")
    assert rows
    assert all(removed for (removed,) in rows)


def test_a_pause_set_before_the_restore_is_kept_by_it(upgraded, tmp_path):
    """The operator pauses the scheduler in the new, empty state directory first, so that
    no tick starts work on what is restored before they looked: the restore accepts that
    directory, and it is still paused afterwards."""
    snapshot, folder, _made = _backup(tmp_path)
    target = tmp_path / "new-host"
    base = ("--state-dir", str(target), "--json")
    paused = run_process(*base, "scheduler", "pause", "--reason", "restoring")
    assert paused.exit_code == 0, paused
    restored = _restore(target, snapshot, folder)
    assert restored.exit_code == 0, restored
    shown = run_process(*base, "scheduler", "status").json()
    assert (shown["paused"], shown["paused_reason"]) == (True, "restoring")


def test_what_cannot_be_restored_is_refused_and_nothing_is_written(upgraded, tmp_path):
    snapshot, folder, _made = _backup(tmp_path)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "aiworker.db").write_text("live")
    refused = _restore(busy, snapshot, folder)
    assert refused.exit_code == 2
    assert "is not empty" in refused.json()["error"]["message"]
    assert sorted(p.name for p in busy.iterdir()) == ["aiworker.db"]
    garbage = tmp_path / "garbage.db"
    garbage.write_text("not a database")
    target = tmp_path / "fresh"
    refused = _restore(target, garbage, folder)
    assert refused.exit_code == 2
    assert "is not a SQLite database" in refused.json()["error"]["message"]
    assert not target.exists()
    for name, tables in (("foreign.db", "CREATE TABLE tasks (a, b)"), ("empty.db", None)):
        other = tmp_path / name
        connection = sqlite3.connect(other)
        connection.execute(tables or "PRAGMA user_version = 1")
        connection.commit()
        connection.close()
        refused = _restore(target, other)
        assert refused.exit_code == 2, refused
        assert refused.json()["error"]["message"] == (
            f"--from {other}: not a snapshot of an aiworker store"
        )
        assert not target.exists()
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    refused = _restore(target, snapshot, unfinished)
    assert refused.exit_code == 2
    assert (
        "has no manifest.json: the backup that filled it did not finish"
        in (refused.json()["error"]["message"])
    )
    assert not target.exists()
    # Another backup's payload folder (taken after a change) is not this snapshot's.
    with sqlite3.connect(upgraded) as changed:
        changed.execute("create table scratch (x)")  # the store changed since
    later = tmp_path / "later.db"
    made = run_process("db", "backup", "--to", str(later), "--with-artifacts", str(tmp_path / "l"))
    assert made.exit_code == 0, made
    refused = _restore(target, snapshot, tmp_path / "l")
    assert refused.exit_code == 2, refused
    assert refused.json()["error"]["message"] == (
        f"--artifacts {tmp_path / 'l'} holds the payloads of another snapshot ({later}), not "
        f"of --from {snapshot}: give the folder that backup filled"
    )
    assert not target.exists()
    full = run_process(
        "--json", "db", "backup", "--to", str(tmp_path / "b2.db"), "--with-artifacts", str(busy)
    )
    assert full.exit_code == 2
    assert "not an empty directory" in full.json()["error"]["message"]
    assert not (tmp_path / "b2.db").exists()


def test_a_restore_that_did_not_finish_starts_no_work_and_odd_paths_are_kept_whole(
    delivered,  # noqa: F811
    upgraded,
    tmp_path,
):
    delivered()
    # `#` and `?` are path characters, not parts of a URI.
    odd = tmp_path / "odd #1?"
    odd.mkdir()
    snapshot, folder, made = _backup(odd)
    assert made["artifacts"]["payloads"] > 0
    target = tmp_path / "restored"
    restored = _restore(target, snapshot, folder)
    assert restored.exit_code == 0, restored
    assert restored.json()["artifacts"]["payloads"] == made["artifacts"]["payloads"]
    assert not (target / "restore.incomplete").exists()
    # As a restore that died before its check leaves it: the tick refuses to start work.
    (target / "restore.incomplete").write_text("restoring\n")
    for args in (("scheduler", "tick"), ("db", "upgrade"), ("status",)):
        refused = run_process("--state-dir", str(target), "--json", *args)
        assert refused.exit_code == 75, (args, refused)
        assert "did not finish" in refused.json()["error"]["message"]


def test_a_stopped_restore_leaves_its_directory_empty_and_a_second_one_touches_nothing(
    upgraded, tmp_path
):
    """While one restore runs, a second one into the same directory is refused and
    touches nothing; the first, stopped, removes what it made (the store first, its marker
    last), so that the same command runs again."""
    snapshot, folder, _made = _backup(tmp_path)
    target = tmp_path / "restored"
    argv = [sys.executable, "-m", "aiworker", "--state-dir", str(target), "--json", "restore"]
    argv += ["--from", str(snapshot), "--artifacts", str(folder)]
    first = subprocess.Popen(
        argv,
        env={**os.environ, "AIWORKER_FAILPOINT": "backup.copying:hang"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        # At its hang: its marker made and its copy of the store begun (before, a loaded
        # machine let the first make its copy while the second ran, and the test
        # blamed the second for it).
        while not (
            (target / "restore.incomplete").exists()
            and any(p.name.endswith(".tmp") for p in target.iterdir())
        ):
            assert time.monotonic() < deadline
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        made = sorted(p.name for p in target.iterdir())
        second = _restore(target, snapshot, folder)
        assert second.exit_code in (2, 75), second
        assert sorted(p.name for p in target.iterdir()) == made
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=60)
    assert first.returncode == 143, (out, err)
    assert sorted(p.name for p in target.iterdir()) == ["locks"]
    again = _restore(target, snapshot, folder)
    assert again.exit_code == 0, again
    assert not (target / "restore.incomplete").exists()
