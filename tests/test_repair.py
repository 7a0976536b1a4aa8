"""Repair episodes: requested changes, a red CI and a moved base are repaired on the task's
own branch and end in a merged PR; an exhausted repair budget ends the task with the
unresolved findings on the issue."""

from __future__ import annotations

import json

import pytest

from aiworker.runtime.gitcache import GitCache
from tests.forge_fixtures import git
from tests.helpers import run_process
from tests.json_keys import assert_keys
from tests.test_delivery import REVIEW_BLOCKING, REVIEW_OK, deliver_until
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc
from tests.test_lifecycle import comments_by_worker, edit_issue
from tests.test_publish import move_main

MORE_TESTS = (
    "import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
    "    def test_negative(self):\n        self.assertEqual(add(-2, -3), -5)\n"
)


def repair_once(cli, task):
    """Claim the waiting repair for slot 1 and run its episode."""
    claim = cli("--json", "claim", "--slot", "1").json()
    assert (claim["claimed"], claim["task"]) == (True, task), claim
    assert query_state(cli, task) == "repairing"
    return run_process("--json", "repair", "--task", str(task), "--slot", "1")


def query_state(cli, task):
    return cli("--json", "task", "show", str(task)).json()["state"]


def show_file(forge, commit, path):
    bare = forge.data / "git" / "team" / "app.git"
    return git("--git-dir", str(bare), "show", f"{commit}:{path}").stdout


def cached_file(state_dir, commit, path):
    """A file of COMMIT as the controller's git cache holds it (before it is pushed)."""
    cache = GitCache(state_dir)
    return git("--git-dir", str(cache.path(1)), "show", f"{commit}:{path}").stdout


def is_ancestor(forge, ancestor, commit):
    bare = forge.data / "git" / "team" / "app.git"
    return git("--git-dir", str(bare), "merge-base", "--is-ancestor", ancestor, commit, check=False)


RESOLVED = "def add(a, b):\n    # resolved against the moved base\n    return a + b\n"
CONFLICTING = "def add(a, b):\n    return b + a + 0\n"  # main's calc.py, against FIX


def resolving_a_conflict(claimed, **repair):
    """A task whose repair episode resolves calc.py (REPAIR: more of the episode's script)."""
    return claimed(
        SCRIPT_ONLY,
        edits={"calc.py": FIX},
        result=result_doc(),
        phases={
            "review": REVIEW_OK,
            "repair": {
                "edits": {"calc.py": RESOLVED},
                "result": result_doc(summary="Resolved the conflict in calc.py"),
                **repair,
            },
        },
    )


def approved_then_conflicting(forge, tmp_path, task):
    """TASK implemented, published, CI'd and approved; then a conflicting change lands on
    main. (the implemented head, the PR, main's new head)"""
    first = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    reports = deliver_until(task, "publish", "ci", "review")
    assert reports["review"].json()["state"] == "approved", reports["review"]
    base = move_main(forge, tmp_path, "calc.py", CONFLICTING)
    return first, reports["publish"].json()["pr"], base


def test_requested_changes_are_repaired_on_the_same_branch_then_approved_and_merged(
    forge, claimed, upgraded, cli, state_dir
):
    task = claimed(
        SCRIPT_ONLY,
        edits={"calc.py": FIX},
        result=result_doc(),
        phases={
            "review": [REVIEW_BLOCKING, REVIEW_OK],
            "repair": {
                "edits": {"test_calc.py": MORE_TESTS},
                "keep_inputs": "repair-inputs",
                "result": result_doc(summary="Added the negative case the review asked for"),
            },
        },
    )
    first = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    reports = deliver_until(task, "publish", "ci", "review")
    assert reports["review"].json()["event"] == "REQUEST_CHANGES"
    assert reports["review"].json()["state"] == "repairing"
    # Waiting for a slot, not failed: nothing was said on the issue.
    assert query(upgraded, "select state, claim_slot from tasks") == [("repairing", None)]
    assert comments_by_worker(forge) == []

    repaired = repair_once(cli, task)
    assert repaired.exit_code == 0, repaired
    report = repaired.json()
    assert_keys("repair", report)
    assert (report["outcome"], report["state"]) == ("implemented", "implemented")
    head = report["head"]
    assert head != first["head"]
    handed = json.loads(cached_file(state_dir, head, "repair-inputs/continuation.json"))
    assert handed["phase"] == "repair"
    assert handed["head"] == first["head"]
    assert [f["message"] for f in handed["findings"]] == ["add() is still wrong"]
    assert [a["phase"] for a in handed["attempts"]][:2] == ["implementation", "publish"]

    again = deliver_until(task, "publish", "ci", "review", "merge")
    for step, result in again.items():
        assert result.exit_code == 0, (step, result)
    pr = reports["publish"].json()["pr"]
    assert again["publish"].json()["pr"] == pr  # the same PR, its branch moved forward
    assert is_ancestor(forge, first["head"], head).returncode == 0
    reviews = forge.client("worker-bot").reviews("team", "app", pr)
    assert [(r.state, r.commit_id) for r in reviews] == [
        ("REQUEST_CHANGES", first["head"]),
        ("APPROVED", head),
    ]
    assert forge.client("worker-bot").pull("team", "app", pr).merged
    assert "test_negative" in show_file(forge, "main", "test_calc.py")
    shown = cli("--json", "task", "show", str(task)).json()
    assert [a["phase"] for a in shown["attempts"]] == [
        "implementation",
        "publish",
        "ci",
        "review",
        "repair",
        "publish",
        "ci",
        "review",
        "merge",
    ]
    assert shown["state"] == "done"


CI_SPLIT = (
    '#!/bin/sh\nset -eu\ncd "$(dirname "$0")/.."\n'
    'if [ "${1:-}" = quick ]; then exec python3 -m unittest -v test_calc; fi\n'
    "python3 -m unittest -v\n"
)
EDGE_RED = (
    "import unittest\n\nfrom calc import add\n\n\nclass EdgeTest(unittest.TestCase):\n"
    "    def test_floats(self):\n        self.assertEqual(add(0.1, 0.2), 0.3)\n"
)
EDGE_GREEN = EDGE_RED.replace("assertEqual", "assertAlmostEqual")


def test_a_red_ci_is_repaired_with_its_evidence_and_merged(
    forge, claimed, upgraded, cli, state_dir
):
    # The issue asks only for a quick check; the repository's full CI runs more.
    edit_issue(forge, 1, body="Fix add().\n\n```aiworker-checks\nquick: ./ci/run quick\n```\n")
    task = claimed(
        SCRIPT_ONLY,
        edits={"calc.py": FIX, "ci/run.sh": CI_SPLIT, "test_edge.py": EDGE_RED},
        result=result_doc(),
        phases={
            "review": REVIEW_OK,
            "repair": {
                "edits": {"test_edge.py": EDGE_GREEN},
                "keep_inputs": "repair-inputs",
                "result": result_doc(summary="Compare floats approximately"),
            },
        },
    )
    first = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert first["outcome"] == "implemented", first
    reports = deliver_until(task, "publish", "ci")
    assert reports["ci"].exit_code == 1
    worker = forge.client("worker-bot")
    assert worker.combined_status("team", "app", first["head"]).state == "failure"
    assert query(upgraded, "select state, claim_slot from tasks") == [("repairing", None)]

    repaired = repair_once(cli, task)
    assert repaired.exit_code == 0, repaired
    head = repaired.json()["head"]
    handed = json.loads(cached_file(state_dir, head, "repair-inputs/continuation.json"))
    [finding] = handed["findings"]
    assert finding["severity"] == "blocker"
    assert f"./ci/run command_failed with exit 1 at {first['head']}" in finding["message"]
    assert "stdout sha256" in finding["message"]
    assert "test_floats" in finding["message"]  # the tail of what failed
    context = json.loads(cached_file(state_dir, head, "repair-inputs/context.json"))
    assert context["cause"] == "ci"

    again = deliver_until(task, "publish", "ci", "review", "merge")
    for step, result in again.items():
        assert result.exit_code == 0, (step, result)
    assert worker.combined_status("team", "app", head).state == "success"
    assert "assertAlmostEqual" in show_file(forge, "main", "test_edge.py")


def test_three_repairs_that_are_not_accepted_end_the_task_with_the_findings_commented(
    forge, claimed, upgraded, cli, state_dir
):
    blocked = result_doc(completion="blocked", summary="Could not find it")
    task = claimed(
        SCRIPT_ONLY,
        edits={"calc.py": FIX},
        result=result_doc(),
        phases={"review": REVIEW_BLOCKING, "repair": {"result": blocked}},
    )
    run_process("--json", "implement", "--task", str(task), "--slot", "1")
    deliver_until(task, "publish", "ci", "review")
    outcomes = []
    for _ in range(3):
        result = repair_once(cli, task)
        assert result.exit_code == 1, result
        assert "the agent reported blocked" in result.json()["reason"], result
        outcomes.append(result.json()["state"])
    assert outcomes == ["repairing", "repairing", "failed"]
    assert query(upgraded, "select state, claim_slot from tasks") == [("failed", None)]
    assert (
        query(upgraded, "select outcome from attempts where phase = 'repair'")
        == [("not_accepted",)] * 3
    )
    [comment] = comments_by_worker(forge)
    assert "3 repair episodes did not resolve these findings" in comment
    assert "- [blocker] add() is still wrong" in comment
    assert "the agent reported blocked, not complete" in comment
    # Nothing more is claimed for it.
    assert cli("--json", "claim", "--slot", "1").json()["claimed"] is False
    # An operator's retry gives it the episode its budget refused, from where the last
    # one left off (its head, its findings), not a new implementation.
    requested = "select data from events where kind = 'repair.requested' order by id desc"
    [(failed,)] = query(upgraded, "select data from events where kind = 'task.failed'")
    last_head = json.loads(failed)["start"]
    retried = cli("--json", "task", "retry", str(task))
    assert retried.json()["state"] == "repairing", retried
    assert json.loads(query(upgraded, requested)[0][0])["start"] == last_head
    again = repair_once(cli, task)
    assert (again.exit_code, again.json()["state"]) == (1, "repairing")
    implemented = "select count(*) from attempts where phase = 'implementation'"
    assert query(upgraded, implemented) == [(1,)]


def test_a_conflicting_base_move_is_repaired_and_merged(
    forge, claimed, upgraded, cli, tmp_path, state_dir
):
    task = resolving_a_conflict(claimed, keep_inputs="repair-inputs")
    first = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    base = move_main(forge, tmp_path, "calc.py", CONFLICTING)
    published = run_process("--json", "publish", "--task", str(task))
    assert published.exit_code == 0, published
    assert (published.json()["pr"], published.json()["state"]) == (None, "repairing")
    assert forge.client("worker-bot").pulls("team", "app", state="all") == []

    repaired = repair_once(cli, task)
    assert repaired.exit_code == 0, repaired
    head = repaired.json()["head"]
    context = json.loads(cached_file(state_dir, head, "repair-inputs/context.json"))
    assert (context["cause"], context["conflicts"], context["base"]) == (
        "conflict",
        ["calc.py"],
        base,
    )
    reports = deliver_until(task, "publish", "ci", "review", "merge")
    for step, result in reports.items():
        assert result.exit_code == 0, (step, result)
    assert reports["publish"].json()["head"] == head
    # The earlier work and the new base are both in the merged history.
    assert is_ancestor(forge, first["head"], head).returncode == 0
    assert is_ancestor(forge, base, head).returncode == 0
    assert show_file(forge, "main", "calc.py") == RESOLVED


def test_a_base_that_moved_into_a_conflict_after_approval_is_repaired_not_retried(
    forge, claimed, upgraded, cli, tmp_path
):
    task = resolving_a_conflict(claimed)
    # Someone lands a conflicting change on main after the approval: the forge cannot
    # merge the PR, and trying again would never change that.
    first, pr, base = approved_then_conflicting(forge, tmp_path, task)
    refused = run_process("--json", "merge", "--task", str(task))
    assert refused.exit_code == 0, refused
    assert refused.json()["state"] == "repairing"
    assert refused.json()["merge_commit"] is None
    assert not forge.client("worker-bot").pull("team", "app", pr).merged
    [(data,)] = query(upgraded, "select data from events where kind = 'repair.requested'")
    requested = json.loads(data)
    assert (requested["cause"], requested["conflicts"], requested["base"]) == (
        "conflict",
        ["calc.py"],
        base,
    )
    charged = "select outcome from attempts where phase = 'merge'"
    assert query(upgraded, charged) == [("succeeded",)]

    repaired = repair_once(cli, task)
    assert repaired.exit_code == 0, repaired
    head = repaired.json()["head"]
    again = deliver_until(task, "publish", "ci", "review", "merge")
    for step, result in again.items():
        assert result.exit_code == 0, (step, result)
    assert again["publish"].json()["pr"] == pr  # the same PR, its branch moved forward
    assert forge.client("worker-bot").pull("team", "app", pr).merged
    assert is_ancestor(forge, first["head"], head).returncode == 0
    assert is_ancestor(forge, base, head).returncode == 0
    assert show_file(forge, "main", "calc.py") == RESOLVED
    # The one publication is recorded as merged, at the repaired head it merged.
    [publication] = cli("--json", "task", "show", str(task)).json()["publications"]
    assert (publication["state"], publication["pr"], publication["head"]) == ("merged", pr, head)


def test_a_conflict_repair_the_merge_step_asked_for_is_taken_up_at_once(
    forge, claimed, upgraded, tmp_path
):
    """Started by the tick (AIWORKER_FOLLOW_UP=1), the merge step that sent the task to a
    conflict repair asks for a check at once, as every step that made progress does: the
    repair, and the delivery after it, follow without waiting for the timer."""
    import time

    task = resolving_a_conflict(claimed)
    approved_then_conflicting(forge, tmp_path, task)
    merged = run_process("--json", "merge", "--task", str(task), env={"AIWORKER_FOLLOW_UP": "1"})
    assert merged.json()["state"] == "repairing", merged
    deadline = time.monotonic() + 300
    while query(upgraded, "select state from tasks") != [("done",)]:
        assert time.monotonic() < deadline, query(upgraded, "select state from tasks")
        time.sleep(0.5)
    assert show_file(forge, "main", "calc.py") == RESOLVED


def test_a_base_that_moved_cleanly_after_approval_is_merged_as_reviewed(
    forge, claimed, upgraded, tmp_path
):
    task = claimed(
        SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc(), phases={"review": REVIEW_OK}
    )
    head = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()["head"]
    reports = deliver_until(task, "publish", "ci", "review")
    assert reports["review"].json()["state"] == "approved", reports["review"]
    base = move_main(forge, tmp_path, "README.md", "moved\n")
    merged = run_process("--json", "merge", "--task", str(task))
    assert merged.exit_code == 0, merged
    assert (merged.json()["state"], merged.json()["head"]) == ("done", head)
    assert query(upgraded, "select count(*) from events where kind = 'repair.requested'") == [(0,)]
    main = forge.client("worker-bot").branch("team", "app", "main").commit.id
    assert is_ancestor(forge, base, main).returncode == 0
    assert is_ancestor(forge, head, main).returncode == 0


@pytest.mark.parametrize("name", ["calc.py", "notes café.txt"])
def test_a_repair_that_leaves_conflict_markers_is_not_accepted(
    forge, claimed, upgraded, cli, tmp_path, name
):
    task = claimed(
        SCRIPT_ONLY,
        edits={"calc.py": FIX, name: FIX},
        result=result_doc(),
        phases={"repair": {"edits": {"notes.txt": "looked at it\n"}, "result": result_doc()}},
    )
    first = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    move_main(forge, tmp_path, name, "def add(a, b):\n    return b + a + 0\n")
    run_process("--json", "publish", "--task", str(task))
    result = repair_once(cli, task)
    assert result.exit_code == 1, result
    # A name git would quote (not ASCII) is found as it is.
    assert f"conflict markers remain in {name}" in result.json()["reason"]
    assert query(upgraded, "select state, claim_slot, head_commit from tasks") == [
        ("repairing", None, first["head"])
    ]


def test_a_result_that_misses_a_passing_threshold_is_not_published(forge, claimed, upgraded, cli):
    edit_issue(
        forge,
        1,
        body="Fix add().\n\n```aiworker-checks\nci: ./ci/run\n"
        "ci measures speed_ms <= 100 (passing)\n```\n",
    )
    slow = (
        '#!/bin/sh\nset -eu\ncd "$(dirname "$0")/.."\necho "aiworker-measurement speed_ms 250"\n'
        "python3 -m unittest -v\n"
    )
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX, "ci/run.sh": slow}, result=result_doc())
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert result.exit_code == 1, result
    report = result.json()
    assert report["gate"]["passed"] is False
    assert report["gate"]["findings"] == [
        "check ci: threshold missed: speed_ms is 250, not <= 100 (speed_ms <= 100 (passing))"
    ]
    assert query(upgraded, "select state from tasks") == [("failed",)]
    refused = run_process("--json", "publish", "--task", str(task))
    assert refused.exit_code == 1
    assert forge.client("worker-bot").pulls("team", "app", state="all") == []


def test_every_repair_cause_has_its_prompt_and_an_unknown_one_is_refused():
    import pytest

    from aiworker.core.phases.prompts import REPAIR_CAUSES
    from aiworker.core.tasks.repairs import CAUSES, RepairRequest

    assert set(REPAIR_CAUSES) == set(CAUSES)
    with pytest.raises(ValueError, match="unknown repair cause 'typo'"):
        RepairRequest("typo", "a" * 40, "b" * 40)
