"""From an implemented task to a merged PR: publish, CI, independent review, merge."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.forge_fixtures import git
from tests.helpers import run_process
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc

REVIEW_OK = {
    "result": {
        "contract": "ait.agent.result.v1",
        "completion": "complete",
        "summary": "The fix is right and tested.",
        "findings": [
            {"severity": "info", "message": "Consider a negative test.", "path": "test_calc.py"}
        ],
    }
}
REVIEW_BLOCKING = {
    "result": {
        "contract": "ait.agent.result.v1",
        "completion": "complete",
        "summary": "Wrong.",
        "findings": [{"severity": "blocker", "message": "add() is still wrong"}],
    }
}


def deliver_until(task, *steps):
    reports = {}
    for step in steps:
        result = run_process("--json", step, "--task", str(task))
        reports[step] = result
        if result.exit_code != 0:
            break
    return reports


@pytest.fixture
def delivered(claimed):
    def run(review=REVIEW_OK):
        task = claimed(
            SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc(), phases={"review": review}
        )
        implemented = run_process("--json", "implement", "--task", str(task), "--slot", "1")
        assert implemented.exit_code == 0, implemented
        return task, implemented.json()["head"]

    return run


def test_issue_to_merged_pr(forge, delivered, upgraded):
    task, head = delivered()
    reports = deliver_until(task, "publish", "ci", "review", "merge")
    for step, result in reports.items():
        assert result.exit_code == 0, (step, result)
    pr = reports["publish"].json()["pr"]
    worker = forge.client("worker-bot")
    combined = worker.combined_status("team", "app", head)
    assert (combined.state, combined.statuses[0].context) == ("success", "aiworker / ci")
    evidence = reports["ci"].json()["evidence"]
    assert combined.statuses[0].target_url == f"file://{evidence}"
    assert '"exit_code": 0' in Path(evidence).read_text()
    [approved] = worker.reviews("team", "app", pr)
    assert (approved.state, approved.user.login, approved.commit_id) == (
        "APPROVED",
        "reviewer-bot",
        head,
    )
    merged = worker.pull("team", "app", pr)
    assert merged.merged
    assert reports["merge"].json()["merge_commit"] == merged.merge_commit_sha
    bare = forge.data / "git" / "team" / "app.git"
    assert "a + b" in git("--git-dir", str(bare), "show", "main:calc.py").stdout
    assert query(upgraded, "select state from tasks") == [("done",)]
    assert query(upgraded, "select phase, outcome from receipts order by id") == [
        ("validation", "pass"),
        ("ci", "pass"),
        ("merge", "merged"),
    ]


def test_blocking_review_requests_changes_and_merge_refuses(forge, delivered, upgraded):
    task, _head = delivered(review=REVIEW_BLOCKING)
    reports = deliver_until(task, "publish", "ci", "review")
    assert reports["review"].exit_code == 1
    assert reports["review"].json()["event"] == "REQUEST_CHANGES"
    pr = reports["publish"].json()["pr"]
    [review] = forge.client("worker-bot").reviews("team", "app", pr)
    assert review.state == "REQUEST_CHANGES"
    assert "[blocker] add() is still wrong" in review.body
    refused = run_process("--json", "merge", "--task", str(task))
    assert refused.exit_code == 1
    assert forge.client("worker-bot").is_merged("team", "app", pr) is False


def test_merge_refuses_when_the_head_moved(forge, delivered, tmp_path, upgraded):
    task, _head = delivered()
    reports = deliver_until(task, "publish", "ci", "review")
    assert all(r.exit_code == 0 for r in reports.values())
    work = tmp_path / "sneaky"
    git("clone", "-q", "-b", f"aiworker/task-{task}", forge.clone_url("alice"), str(work))
    (work / "calc.py").write_text("def add(a, b):\n    return 0\n")
    git("commit", "-qam", "Sneak in a change", cwd=work)
    git("push", "-q", "origin", f"aiworker/task-{task}", cwd=work)
    refused = run_process("--json", "merge", "--task", str(task))
    assert refused.exit_code == 1
    assert "head moved" in refused.json()["error"]["message"]
    pr = reports["publish"].json()["pr"]
    assert forge.client("worker-bot").is_merged("team", "app", pr) is False
