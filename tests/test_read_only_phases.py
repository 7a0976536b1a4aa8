"""A review and a plan run at a detached head they cannot change: a job that tries to change
files is refused by the file system in bubblewrap, and where nothing stops it (the
unsandboxed local backend) what it changed is found, and its result is not accepted."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.delivery_fixtures import write_scenario
from tests.helpers import configure, run_process
from tests.test_delivery import REVIEW_OK, deliver_until
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc

TRYING_REVIEW = {"edits": {"calc.py": "def add(a, b):\n    return 42\n"}, **REVIEW_OK}


def _without_bubblewrap(tmp_path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("git", "sh", "python3"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    return {"PATH": str(bin_dir)}


@pytest.mark.parametrize("sandbox", ["bubblewrap", "unsandboxed"])
def test_a_review_that_changes_files_is_not_accepted(forge, claimed, upgraded, tmp_path, sandbox):
    extra = SCRIPT_ONLY
    env = None
    if sandbox == "unsandboxed":
        extra += '[execution]\nbackend = "local"\nlocal_unsandboxed = true\n'
        env = _without_bubblewrap(tmp_path)
    task = claimed(
        extra, edits={"calc.py": FIX}, result=result_doc(), phases={"review": TRYING_REVIEW}
    )
    implemented = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert implemented.exit_code == 0, implemented
    reports = deliver_until(task, "publish", "ci")
    assert all(r.exit_code == 0 for r in reports.values()), reports
    reviewed = run_process("--json", "review", "--task", str(task), env=env)
    assert reviewed.exit_code != 0, reviewed
    assert reviewed.json()["event"] is None
    pr = reports["publish"].json()["pr"]
    assert forge.client("worker-bot").reviews("team", "app", pr) == []
    [(outcome, reason)] = query(
        upgraded, "select outcome, reason from attempts where phase = 'review'"
    )
    if sandbox == "bubblewrap":
        # The write itself fails (the checkout is mounted read-only): the agent stops.
        assert (outcome, reason) == ("other", "script provider exited 1")
    else:
        assert outcome == "invalid", (outcome, reason)
        assert reason.startswith("the review changed the checkout it must leave as it was")
        assert "HEAD moved to" in reason, reason
    assert query(upgraded, "select state from tasks") == [("awaiting_review",)]


def test_a_plan_that_changes_files_is_not_posted(forge, upgraded, tmp_path, monkeypatch, cli):
    config = configure(tmp_path, forge, monkeypatch)
    planning = {"edits": {"calc.py": FIX}, "result": result_doc(summary="One step")}
    write_scenario(tmp_path / "scenario.json", phases={"planning": planning})
    config.write_text(SCRIPT_ONLY + "\n" + config.read_text())
    forge.client("alice").add_labels("team", "app", 1, ["aiworker-plan"])
    assert cli("poll").exit_code == 0
    cli("--json", "claim", "--slot", "1")
    result = run_process("--json", "plan", "--task", "1", "--slot", "1")
    assert result.exit_code != 0, result
    assert result.json()["state"] == "ready"  # retried within the planning budget
    [(outcome, reason)] = query(
        upgraded, "select outcome, reason from attempts where phase = 'planning'"
    )
    # The write fails (the checkout is mounted read-only), and the agent stops.
    assert (outcome, reason) == ("other", "script provider exited 1")
    planner = list(forge.client("alice").comments("team", "app", 1))
    assert [c for c in planner if c.user.login == "planner-bot"] == []
