"""`aiworker publish`: exactly one PR whatever the crash, and stale receipts refused."""

from __future__ import annotations

import pytest

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


def test_a_moved_base_refuses_the_stale_receipts(forge, implemented, upgraded, tmp_path):
    task, _ = implemented
    work = tmp_path / "alice"
    git("clone", "-q", forge.clone_url("alice"), str(work))
    (work / "README.md").write_text("moved\n")
    git("commit", "-qam", "Move main", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    result = publish(task)
    assert result.exit_code == 1, result
    assert "the base moved" in result.json()["error"]["message"]
    assert forge.client("worker-bot").pulls("team", "app", state="all") == []
    assert query(upgraded, "select count(*) from publications") == [(0,)]
    assert query(upgraded, "select kind from events where kind = 'publish.refused'") == [
        ("publish.refused",)
    ]
