"""What an operator reads in a terminal of 80x24: status explains why nothing moves, and
every table (status, providers, task list and show, qemu list, doctor) fits, uncut."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.helpers import at_terminal, run_process
from tests.test_implement import FIX, SCRIPT_ONLY, result_doc

VIEWS = [
    ("status",),
    ("status", "--all"),
    ("providers", "status"),
    ("task", "list"),
    ("task", "show", "1"),
    ("qemu", "list"),
    ("doctor",),
]


def readable_at_80_columns(text):
    for line in text.splitlines():
        assert len(line) <= 80, f"wider than 80 columns: {line!r}"
    assert "…" not in text, text  # nothing cut short


def test_every_table_reads_at_80_columns(forge, claimed, upgraded):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc(), failure="transient")
    implemented = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert implemented.json()["outcome"] == "transient", implemented
    for view in VIEWS:
        shown = at_terminal(*view)
        assert "error" not in shown.lower().split(":")[0], shown
        readable_at_80_columns(shown)
    providers = at_terminal("providers", "status")
    for header in ("provider", "window", "used %", "resets", "headroom", "eligible", "reason"):
        assert header in providers
    shown = at_terminal("task", "show", "1")
    assert f"task {task} (issue) team/app#1" in shown
    assert "state ready" in shown
    assert "1 implementation script: transient" in shown
    assert "(removed)" in shown  # the attempt's workspace went with the attempt


def test_status_says_why_nothing_moves_on_one_screen(forge, claimed, upgraded, state_dir):
    claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    running = at_terminal("status")
    assert running.startswith("Scheduler: running\n"), running
    assert "Last check: never" in running
    assert run_process("scheduler", "pause", "--reason", "forge upgrade tonight").exit_code == 0
    state_file = state_dir / "scheduler.json"
    state = json.loads(state_file.read_text())
    long_ago = datetime.now(UTC) - timedelta(minutes=25)
    state.update(
        last_check=long_ago.isoformat(),
        poll_error="forge http://127.0.0.1:9: connection refused",
        poll_error_at=(datetime.now(UTC) - timedelta(minutes=2)).isoformat(),
        poll_failures=3,
    )
    state_file.write_text(json.dumps(state))
    paused = at_terminal("status")
    readable_at_80_columns(paused)
    assert len(paused.rstrip("\n").splitlines()) <= 24, paused
    words = " ".join(paused.split())
    assert "Scheduler: PAUSED by " in words
    assert re.search(r"\(command line\) since (just now|\d+ s ago)", words), words
    assert "forge upgrade tonight" in words
    assert "Last check: 25 min ago" in words
    assert "OVERDUE (interval 180 s): is the timer running?" in words
    assert "Polls failing: 3 in a row, the last 2 min ago: forge http://127.0.0.1:9" in words
    assert "claimed" in words  # the one state that holds a task
    assert "awaiting_review" not in words  # states without tasks are left out
    report = run_process("--json", "status").json()
    assert report["scheduler"]["paused"] is True
    assert report["scheduler"]["paused_by"].endswith("(command line)")
    assert report["scheduler"]["overdue"] is True
    assert report["scheduler"]["next_check"] is None
    assert report["tasks"]["awaiting_review"] == 0  # the JSON keeps every state
    assert run_process("scheduler", "resume").exit_code == 0
    resumed = run_process("--json", "status").json()["scheduler"]
    assert (resumed["paused"], resumed["paused_by"], resumed["paused_at"]) == (False, "", None)


def test_a_pause_stands_until_resumed_whatever_is_said_after_it(cli, upgraded, state_dir):
    """A reason too long for the scheduler's state is refused (it once made the state
    unreadable, read as running: ticks went on starting work); a second pause leaves the
    first's reason, who and since when standing; a state that cannot be read stops new
    work, saying why, until `scheduler resume` writes it anew."""
    state_file = state_dir / "scheduler.json"
    too_long = cli("--json", "scheduler", "pause", "--reason", "é" * 11_000)
    assert too_long.exit_code == 2, too_long
    assert too_long.json()["error"]["message"] == (
        "the pause reason is 11000 characters long; at most 500"
    )
    assert not state_file.exists()
    first = cli("--json", "scheduler", "pause", "--reason", "é" * 500).json()
    assert (first["paused"], first["already"]) == (True, False)
    again = cli("scheduler", "pause", "--reason", "another")
    assert again.exit_code == 0
    assert f"already paused by {first['paused_by']} since {first['paused_at']}" in again.stdout
    shown = cli("--json", "status").json()["scheduler"]
    assert (shown["paused"], shown["paused_reason"], shown["paused_at"]) == (
        True,
        "é" * 500,
        first["paused_at"],
    )
    assert cli("scheduler", "resume").exit_code == 0
    state_file.write_text('{"paused": true, "paused_reason": "cut sho')
    shown = cli("--json", "status").json()["scheduler"]
    assert shown["paused"] is True
    assert shown["paused_reason"] == (
        f"{state_file} cannot be read; `aiworker scheduler resume` writes it anew"
    )
    ticked = cli("--json", "scheduler", "tick").json()
    assert (ticked["status"], ticked["started"]) == ("paused", [])
    assert cli("scheduler", "resume").exit_code == 0
    assert cli("--json", "status").json()["scheduler"]["paused"] is False


CANARY_KEY = "canary-7d1f2a9e4b6c"  # a provider's key, kept in its home's auth.json


def test_a_failed_attempt_keeps_what_the_provider_printed_masked(
    forge, claimed, upgraded, state_dir, cli
):
    home = state_dir / "providers" / "script"
    home.mkdir(parents=True)
    (home / "auth.json").write_text(json.dumps({"api_key": CANARY_KEY}))
    noisy = (
        f"loading key {CANARY_KEY}\nAuthorization: Bearer abcdefgh12345678\n"
        f"forge token {forge.tokens['worker-bot']}\nthe model gave up on calc.py"
    )
    task = claimed(
        SCRIPT_ONLY, edits={"calc.py": FIX}, stderr=noisy, failure="transient", result=None
    )
    failed = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    # Its class comes from what it printed, which here holds a random token (a "402" in
    # it reads as a quota failure): any failure will do, what it printed is the point.
    assert failed.json()["outcome"] in ("transient", "quota_exhausted", "auth"), failed
    [attempt] = cli("--json", "task", "show", str(task)).json()["attempts"]
    assert "the model gave up on calc.py" in attempt["output_tail"]
    kept = "".join(Path(attempt[name]).read_text() for name in ("prompt", "log"))
    for secret in (CANARY_KEY, "abcdefgh12345678", forge.tokens["worker-bot"]):
        assert secret not in kept
    assert "Bearer ***" in kept
    assert attempt["result"] is None  # it gave no result: nothing is written for one
    assert "add() returns the wrong result" in Path(attempt["prompt"]).read_text()
    for name in ("prompt", "log"):
        assert Path(attempt[name]).stat().st_mode & 0o777 == 0o600
    shown = at_terminal("task", "show", str(task))
    readable_at_80_columns(shown)
    assert "it printed, at the end:" in shown
    assert "| the model gave up on calc.py" in shown
    # Kept while the task is not delivered; removed with the task's files after that.
    assert run_process("task", "cancel", str(task)).exit_code == 0
    assert Path(attempt["log"]).exists()
    [after_cancel] = cli("--json", "task", "show", str(task)).json()["attempts"]
    assert after_cancel["output_tail"] == attempt["output_tail"]


def test_a_secret_the_kept_tail_would_cut_is_masked_before_the_cut(upgraded, state_dir):
    from aiworker.config.loader import load_config
    from aiworker.core.context import Environment
    from aiworker.core.phases.attempt_files import keep_attempt_files
    from aiworker.core.phases.run import KEPT_TAIL, RunReport
    from aiworker.store.attempts import start_attempt
    from aiworker.store.engine import Database
    from aiworker.store.task_records import create_task, ensure_repository

    key = "sk-" + "Q7" * 20  # a provider key's shape, 43 characters
    # The key straddles the point where the kept tail begins.
    stderr = b"x" * 20_000 + b" " + key.encode() + b" " + b"y" * (KEPT_TAIL - 20)
    env = Environment(state_dir, load_config(state_dir / "absent.toml", required=False))
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        task = create_task(session, repo.id, "issue", issue_number=1).id
        attempt = start_attempt(session, task, "implementation", "script", None, None, {})
    keep_attempt_files(env, db, task, attempt, "prompt", RunReport(None, "other", "", b"", stderr))
    db.dispose()
    kept = (state_dir / "attempts" / f"task-{task}-attempt-{attempt}" / "output.log").read_text()
    assert "Q7Q7Q7" not in kept
    assert kept.endswith("y" * (KEPT_TAIL - 20))
