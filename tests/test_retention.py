"""The retention pass: an ended task's payloads, git refs and evidence go once every
reference to them has expired; records and digests stay; what is still referred to
stays."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import requests

from aiworker.runtime.artifact_files import ArtifactFiles
from tests.helpers import run_process
from tests.test_delivery import deliver_until, delivered  # noqa: F401 - fixture
from tests.test_implement import query
from tests.test_web_api import serving


def _age(database: Path, days: int, where: str = "1 = 1") -> None:
    """Move the artifacts' window and the tasks' last change DAYS into the past, as
    DAYS of waiting would."""
    shift = f"-{days} days"
    with sqlite3.connect(database) as db:
        db.execute(
            "update artifacts set created_at = datetime(created_at, ?), "
            f"expires_at = datetime(expires_at, ?) where {where}",
            (shift, shift),
        )
        db.execute("update tasks set updated_at = datetime(updated_at, ?)", (shift,))


def _task_refs(state_dir: Path) -> list[str]:
    cache = state_dir / "git-cache" / "repo-1.git"
    out = subprocess.run(
        ["git", "--git-dir", str(cache), "for-each-ref", "--format=%(refname)", "refs/aiworker/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [ref for ref in out.splitlines() if "task-" in ref]


def test_an_ended_tasks_payloads_and_refs_go_after_their_window_and_the_records_stay(
    delivered,  # noqa: F811
    upgraded,
    state_dir,
):
    task, _head = delivered()
    reports = deliver_until(task, "publish", "ci", "review", "merge")
    assert [r.exit_code for r in reports.values()] == [0, 0, 0, 0], reports
    assert query(upgraded, "select state from tasks") == [("done",)]
    kept = query(upgraded, "select distinct sha256 from artifacts where removed_at is null")
    assert len(kept) >= 4  # prompt, result, the checks' tails and receipts
    store = state_dir / "artifacts" / "sha256"
    assert all((store / sha[:2] / sha).is_file() for (sha,) in kept)
    assert _task_refs(state_dir) == [f"refs/aiworker/review/task-{task}"]

    # Delivered just now: its artifacts are inside their window and stay.
    first = run_process("--json", "retention")
    assert first.exit_code == 0, first
    assert first.json()["removed"] == []
    assert first.json()["payloads"] == len(kept)
    # Its review ref goes at once (the task is delivered).
    assert first.json()["refs"] == [
        {"task": task, "repository": 1, "ref": f"refs/aiworker/review/task-{task}"}
    ]
    assert _task_refs(state_dir) == []

    # All past their window, but one payload is also named by a reference that is not
    # (another task's, stored later): that one stays.
    _age(upgraded, 8)
    [(shared,)] = query(upgraded, "select sha256 from artifacts where name = 'prompt.md' limit 1")
    with sqlite3.connect(upgraded) as db:
        db.execute(
            "insert into artifacts (sha256, size, media_type, name, created_at, expires_at) "
            "select sha256, size, media_type, 'prompt.md', datetime('now'), "
            "datetime('now', '+1 day') from artifacts where sha256 = ? limit 1",
            (shared,),
        )
    ahead = run_process("--json", "retention", "--dry-run").json()
    gone = {r["sha256"] for r in ahead["removed"]}
    assert gone == {sha for (sha,) in kept} - {shared}
    assert all((store / sha[:2] / sha).is_file() for sha in gone)  # a dry run removes nothing
    shown = run_process("--json", "status").json()["artifacts"]
    assert (shown["payloads"], shown["removable"]) == (len(kept), len(kept) - 1)

    swept = run_process("--json", "retention")
    assert swept.exit_code == 0, swept
    assert {r["sha256"] for r in swept.json()["removed"]} == gone
    assert swept.json()["payloads"] == 1
    assert (store / shared[:2] / shared).is_file()
    # Its last reference expires too: it goes.
    _age(upgraded, 8, where="task_id is null")
    swept = run_process("--json", "retention")
    assert [r["sha256"] for r in swept.json()["removed"]] == [shared]
    assert swept.json()["payloads"] == 0
    assert sum(r["bytes"] for r in swept.json()["removed"]) == swept.json()["freed_bytes"] > 0
    assert [p for p in store.rglob("*") if not p.is_dir()] == []
    # The records stay, with their digests and sizes, marked removed.
    rows = query(upgraded, "select sha256, size, removed_at from artifacts")
    assert rows
    assert all(sha and size >= 0 and removed for sha, size, removed in rows)
    again = run_process("--json", "retention").json()
    assert (again["removed"], again["refs"], again["changed"]) == ([], [], False)

    receipt = query(upgraded, "select id from receipts where phase = 'ci'")[0][0]
    with serving() as url:
        document = requests.get(f"{url}/api/v1/receipts/{receipt}", timeout=10).json()
        assert document["artifacts"]
        assert all(a["removed_at"] for a in document["artifacts"])
        sha = document["artifacts"][0]["sha256"]
        assert requests.get(f"{url}/artifacts/{sha}", timeout=10).status_code == 404


def test_a_working_tasks_artifacts_stay_whatever_their_age(claimed, upgraded, state_dir):
    from tests.test_implement import FIX, SCRIPT_ONLY, result_doc

    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    assert run_process("--json", "implement", "--task", str(task), "--slot", "1").exit_code == 0
    _age(upgraded, 30)
    swept = run_process("--json", "retention")
    assert swept.exit_code == 0, swept
    assert swept.json()["removed"] == []
    assert query(upgraded, "select count(*) from artifacts where removed_at is not null") == [(0,)]


def test_a_stale_transfer_is_reclaimed_and_a_fresh_one_kept(upgraded, state_dir):
    partial = state_dir / "artifacts" / "partial"
    partial.mkdir(parents=True)
    stale, fresh = partial / f"{'a' * 64}.part", partial / f"{'b' * 64}.part"
    stale.write_bytes(b"x" * 100)
    fresh.write_bytes(b"y" * 100)
    eight_days_ago = stale.stat().st_mtime - 8 * 86400
    os.utime(stale, (eight_days_ago, eight_days_ago))
    swept = run_process("--json", "retention").json()
    assert swept["files"] == [str(stale)]
    assert (stale.exists(), fresh.exists()) == (False, True)


def test_payloads_a_crashed_pass_moved_aside_or_nobody_recorded_are_settled(
    claimed, upgraded, state_dir
):
    from tests.test_implement import FIX, SCRIPT_ONLY, result_doc

    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    assert run_process("--json", "implement", "--task", str(task), "--slot", "1").exit_code == 0
    files = ArtifactFiles(state_dir / "artifacts")
    # A pass that died between moving a payload aside and committing: its record still
    # names it, so the next pass puts it back.
    [(named,)] = query(upgraded, "select sha256 from artifacts where name = 'prompt.md'")
    assert files.discard(named) > 0
    assert not files.has(named)
    # A step that stored a payload and died before recording it, long ago.
    orphan, _size = files.put(b"stored, never recorded\n")
    month_ago = files.path(orphan).stat().st_mtime - 30 * 86400
    os.utime(files.path(orphan), (month_ago, month_ago))
    swept = run_process("--json", "retention")
    assert swept.exit_code == 0, swept
    assert files.read(named)  # back, whole
    assert [r["sha256"] for r in swept.json()["removed"]] == [orphan]
    assert not files.has(orphan)
    assert files.discarded() == []


def test_a_ref_git_cannot_remove_stays_for_the_next_pass_and_the_tick_goes_on(
    delivered,  # noqa: F811
    upgraded,
    state_dir,
    cli,
):
    task, _head = delivered()
    reports = deliver_until(task, "publish", "ci", "review", "merge")
    assert [r.exit_code for r in reports.values()] == [0, 0, 0, 0], reports
    ref = f"refs/aiworker/review/task-{task}"
    stale = state_dir / "git-cache" / "repo-1.git" / f"{ref}.lock"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("left by a git that died\n")
    swept = run_process("--json", "retention")
    assert swept.exit_code == 0, swept
    assert swept.json()["refs"] == []
    assert _task_refs(state_dir) == [ref]
    ticked = run_process("--json", "scheduler", "tick")
    assert ticked.exit_code == 0, ticked
    stale.unlink()
    assert run_process("--json", "retention").json()["refs"][0]["ref"] == ref
