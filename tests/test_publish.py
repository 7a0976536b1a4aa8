"""`aiworker publish`: exactly one PR whatever the crash, and stale receipts refused."""

from __future__ import annotations

import json

import pytest
import requests

from tests.forge_fixtures import git
from tests.helpers import run_process
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc


@pytest.fixture
def implemented(claimed, upgraded):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert result.exit_code == 0, result
    return task, result.json()["head"]


def publish(task, failpoint=None):
    env = {"AIWORKER_FAILPOINT": failpoint} if failpoint else None
    return run_process("--json", "publish", "--task", str(task), env=env)


def the_only_pull(forge, head):
    pulls = forge.client("worker-bot").pulls("team", "app", state="all")
    assert len(pulls) == 1, [p.number for p in pulls]
    assert pulls[0].head.sha == head
    return pulls[0]


def test_publish_opens_one_pr_at_the_receipts_head(forge, implemented, upgraded):
    task, head = implemented
    result = publish(task)
    assert result.exit_code == 0, result
    report = result.json()
    assert (report["created"], report["head"], report["branch"]) == (
        True,
        head,
        f"aiworker/task-{task}",
    )
    pull = the_only_pull(forge, head)
    assert pull.number == report["pr"]
    assert f"<!-- aiworker:task={task} intent=" in pull.body
    assert query(upgraded, "select state from tasks") == [("awaiting_ci",)]
    assert query(upgraded, "select state, pr_number from publications") == [
        ("opened", report["pr"])
    ]


@pytest.mark.parametrize(
    "point", ["publish.before_request", "publish.after_request", "publish.after_record"]
)
def test_a_crash_at_any_point_still_leaves_exactly_one_pr(forge, implemented, upgraded, point):
    task, head = implemented
    crashed = publish(task, failpoint=point)
    assert crashed.exit_code == -9, crashed
    rerun = publish(task)
    if point == "publish.after_record":
        assert rerun.exit_code == 1  # already published: nothing more to do
        assert "awaiting_ci" in rerun.json()["error"]["message"]
    else:
        assert rerun.exit_code == 0, rerun
        assert rerun.json()["created"] is (point == "publish.before_request")
    the_only_pull(forge, head)
    assert query(upgraded, "select state from tasks") == [("awaiting_ci",)]
    # Run by hand, the step closed what its killed run left before it was charged again.
    assert query(upgraded, "select count(*) from attempts where finished_at is null") == [(0,)]
    if point != "publish.after_record":
        outcomes = query(
            upgraded, "select outcome from attempts where phase = 'publish' order by id"
        )
        assert outcomes == [("abandoned",), ("succeeded",)]


def move_main(forge, tmp_path, path: str, text: str) -> str:
    work = tmp_path / "alice"
    git("clone", "-q", forge.clone_url("alice"), str(work))
    (work / path).write_text(text)
    git("add", "--", path, cwd=work)
    git("commit", "-qm", f"Change {path} on main", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    return git("rev-parse", "HEAD", cwd=work).stdout.strip()


def test_a_moved_base_is_merged_into_the_work_and_checked_again(
    forge, implemented, upgraded, tmp_path
):
    task, head = implemented
    base = move_main(forge, tmp_path, "README.md", "moved\n")
    result = publish(task)
    assert result.exit_code == 0, result
    merged = result.json()["head"]
    assert merged != head
    pull = the_only_pull(forge, merged)
    commit = requests.get(
        f"{forge.url}/api/v1/repos/team/app/git/commits/{merged}", timeout=10
    ).json()
    # An ordinary merge: the work first, then the new base; nothing discarded.
    assert [p["sha"] for p in commit["parents"]] == [head, base]
    assert commit["commit"]["message"].startswith("Merge branch 'main' into aiworker/task-")
    assert query(upgraded, "select head_commit, base_commit from tasks") == [(merged, base)]
    receipts = query(upgraded, f"select outcome from receipts where head_commit = '{merged}'")
    assert receipts == [("pass",)]
    assert f"passed at {merged} on base {base}" in pull.body
    assert query(upgraded, "select kind from events where kind = 'task.base_refreshed'") == [
        ("task.base_refreshed",)
    ]


@pytest.mark.parametrize(
    ("path", "text", "cause", "reason"),
    [
        ("calc.py", "def add(a, b):\n    return b + a + 0\n", "conflict", "conflicts in calc.py"),
        (
            "test_calc.py",
            "import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n"
            "    def test_add(self):\n        self.assertEqual(add(2, 2), 5)\n",
            "base_checks",
            "the checks fail: check ci exited 1",
        ),
    ],
    ids=["conflict", "checks-fail-after-merge"],
)
def test_a_move_that_cannot_be_taken_starts_a_repair_and_nothing_is_published(
    forge, implemented, upgraded, tmp_path, path, text, cause, reason
):
    task, head = implemented
    base = move_main(forge, tmp_path, path, text)
    result = publish(task)
    assert result.exit_code == 0, result
    assert (result.json()["pr"], result.json()["state"]) == (None, "repairing")
    assert forge.client("worker-bot").pulls("team", "app", state="all") == []
    assert query(upgraded, "select count(*) from publications") == [(0,)]
    # The work is kept as it was; the repair starts from the merge of the new base.
    assert query(upgraded, "select state, head_commit, claim_slot from tasks") == [
        ("repairing", head, None)
    ]
    [(data,)] = query(upgraded, "select data from events where kind = 'repair.requested'")
    request = json.loads(data)
    assert (request["cause"], request["base"]) == (cause, base)
    assert reason in request["reason"]
    merge = requests.get(
        f"{forge.url}/api/v1/repos/team/app/git/commits/{request['start']}", timeout=10
    )
    assert merge.status_code == 404  # made in the controller's cache, not pushed
    # Publishing again is refused: the task waits for its repair.
    again = publish(task)
    assert again.exit_code == 1
    assert "is repairing, not implemented" in again.json()["error"]["message"]


def test_a_retry_after_publish_spent_its_budget_publishes_the_work_it_kept(
    forge, implemented, upgraded, cli
):
    """Publishing fails until its budget is spent (here, raising before its request): the
    task fails. The operator's retry takes it back where it failed, its work kept: the
    next publish opens the PR at the same head, and nothing is implemented again."""
    task, head = implemented
    for _ in range(5):
        failed = publish(task, failpoint="publish.before_request:raise")
        assert failed.exit_code == 1, failed
        if query(upgraded, "select state from tasks") == [("failed",)]:
            break
    assert query(upgraded, "select state, head_commit from tasks") == [("failed", head)]
    retried = cli("--json", "task", "retry", str(task))
    assert retried.exit_code == 0, retried
    assert (retried.json()["state"], retried.json()["budget_reset"]["publish"] > 0) == (
        "implemented",
        True,
    )
    assert publish(task).exit_code == 0
    the_only_pull(forge, head)
    assert query(upgraded, "select count(*) from attempts where phase = 'implementation'") == [(1,)]
    assert query(upgraded, "select state from tasks") == [("awaiting_ci",)]


def test_a_retry_from_the_start_makes_the_work_anew(implemented, upgraded, cli):
    task, _ = implemented
    for _ in range(5):
        publish(task, failpoint="publish.before_request:raise")
        if query(upgraded, "select state from tasks") == [("failed",)]:
            break
    retried = cli("--json", "task", "retry", str(task), "--from-start")
    assert retried.exit_code == 0, retried
    assert query(upgraded, "select state from tasks") == [("ready",)]
