"""Planning: a plan issue gets a posted plan, nothing runs before a writer approves it, its
milestones run one at a time on one branch and end in one reviewed, merged PR."""

from __future__ import annotations

import json

from tests.delivery_fixtures import write_scenario
from tests.helpers import configure, run_process
from tests.json_keys import assert_keys
from tests.test_delivery import REVIEW_OK, deliver_until
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc
from tests.test_lifecycle import edit_issue
from tests.test_repair import MORE_TESTS, show_file

MILESTONES = [
    {
        "title": "Make add() return the sum",
        "scope": "calc.add returns a + b.",
        "acceptance_criteria": ["add(2, 3) == 5"],
        "validation": [{"check_id": "unit", "command": ["./ci/run"]}],
    },
    {
        "title": "Cover negative numbers",
        "scope": "A test for negative operands.",
        "acceptance_criteria": ["test_negative passes"],
        "simple": True,
    },
]
SCENARIO = {
    "result": result_doc(),
    "phases": {
        "planning": {"result": result_doc(summary="Two steps", milestones=MILESTONES)},
        "implementation": {
            "by_milestone": {
                "1": {"edits": {"calc.py": FIX}, "result": result_doc()},
                "2": {"edits": {"test_calc.py": MORE_TESTS}, "result": result_doc()},
            }
        },
        "review": REVIEW_OK,
    },
}


def comments(forge, login):
    return [
        c.body for c in forge.client("alice").comments("team", "app", 1) if c.user.login == login
    ]


def step(cli, task=1):
    result = cli("--json", "milestones", "--task", str(task))
    assert result.exit_code == 0, result
    assert_keys("milestones", result.json())
    return result.json()


def claim_and_run(cli, phase, expected_task):
    claim = cli("--json", "claim", "--slot", "1").json()
    assert (claim["claimed"], claim["task"]) == (True, expected_task), claim
    result = run_process("--json", phase, "--task", str(expected_task), "--slot", "1")
    assert result.exit_code == 0, result
    return result.json()


def planned(forge, upgraded, tmp_path, monkeypatch, cli):
    config = configure(tmp_path, forge, monkeypatch)
    write_scenario(tmp_path / "scenario.json", **SCENARIO)
    config.write_text(SCRIPT_ONLY + "\n" + config.read_text())
    forge.client("alice").add_labels("team", "app", 1, ["aiworker-plan"])
    assert cli("poll").exit_code == 0
    assert query(upgraded, "select id, kind, state from tasks") == [(1, "plan", "ready")]
    report = claim_and_run(cli, "plan", 1)
    assert_keys("plan", report)
    assert (report["outcome"], report["milestones"], report["state"]) == (
        "planned",
        2,
        "awaiting_plan_approval",
    )
    return report


def test_an_approved_plan_runs_its_milestones_in_order_to_one_merged_pr(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    plan = planned(forge, upgraded, tmp_path, monkeypatch, cli)
    [posted] = comments(forge, "planner-bot")
    assert "### 1. Make add() return the sum" in posted
    assert "### 2. Cover negative numbers (simple)" in posted
    assert "`/aiworker approve`" in posted
    # Nothing runs before a writer approves: not on its own, not for a read-only user.
    assert step(cli)["approval"] == "no approval by a writer yet"
    forge.client("reader").create_comment("team", "app", 1, "/aiworker approve")
    waiting = step(cli)
    assert waiting["state"] == "awaiting_plan_approval"
    assert "ignored: commented /aiworker approve by reader (read)" in waiting["approval"]
    assert cli("--json", "claim", "--slot", "1").json()["claimed"] is False

    forge.client("alice").add_labels("team", "app", 1, ["aiworker-approved"])
    approved = step(cli)
    assert (approved["state"], approved["started"]) == ("milestones", 2)
    assert "labelled aiworker-approved by alice (write)" in approved["approval"]
    assert query(upgraded, "select id, kind, parent_id, state from tasks where id > 1") == [
        (2, "milestone", 1, "ready"),
        (3, "milestone", 1, "new"),
    ]
    first = claim_and_run(cli, "implement", 2)
    assert first["base"] == plan["base"]
    after_first = step(cli)
    assert (after_first["accepted"], after_first["started"]) == ([2], 3)
    second = claim_and_run(cli, "implement", 3)
    assert second["base"] == first["head"]  # the second starts where the first ended
    done = step(cli)
    assert (done["accepted"], done["state"]) == ([3], "implemented")
    assert query(upgraded, "select head_commit, base_commit from tasks where id = 1") == [
        (second["head"], plan["base"])
    ]
    # Every milestone's own checks passed at its own head; the combined checks at the end.
    receipts = query(upgraded, "select task_id, check_id, head_commit, outcome from receipts")
    assert (2, "unit", first["head"], "pass") in receipts
    assert (3, "ci", second["head"], "pass") in receipts
    assert {(t, c) for t, c, h, o in receipts if t == 1 and h == second["head"]} == {
        (1, "ci"),
        (1, "unit"),
    }

    reports = deliver_until(1, "publish", "ci", "review", "merge", cli=cli)
    for name, result in reports.items():
        assert result.exit_code == 0, (name, result)
    pull = forge.client("alice").pull("team", "app", reports["publish"].json()["pr"])
    assert pull.merged
    assert f"accepted at {first['head']}" in pull.body
    assert f"accepted at {second['head']}" in pull.body
    assert "test_negative" in show_file(forge, "main", "test_calc.py")
    assert "a + b" in show_file(forge, "main", "calc.py")
    assert query(upgraded, "select id, state from tasks order by id") == [
        (1, "done"),
        (2, "done"),
        (3, "done"),
    ]
    [(evidence,)] = query(upgraded, "select body from receipts where phase = 'merge'")
    assert json.loads(evidence)["milestones"] == [
        {"task": 2, "head": first["head"]},
        {"task": 3, "head": second["head"]},
    ]
    simple = query(upgraded, "select settings from attempts where task_id = 3")
    assert json.loads(simple[0][0])["simple"] is True


def test_a_changed_scope_pauses_an_approved_plan_until_it_is_approved_again(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    planned(forge, upgraded, tmp_path, monkeypatch, cli)
    forge.client("alice").create_comment("team", "app", 1, "/aiworker approve")
    assert step(cli)["state"] == "milestones"
    edit_issue(forge, 1, body="Fix add(), and keep it fast.")
    assert cli("poll").exit_code == 0
    paused = step(cli)
    assert paused["state"] == "awaiting_plan_approval"
    assert "the issue changed after the plan was approved" in paused["reason"]
    # The milestone that was about to start waits too.
    assert query(upgraded, "select state from tasks where id = 2") == [("new",)]
    assert "The plan is paused" in comments(forge, "worker-bot")[-1]
    # The earlier approval does not count again; nothing of the plan can be claimed.
    assert step(cli)["state"] == "awaiting_plan_approval"
    assert cli("--json", "claim", "--slot", "1").json()["claimed"] is False
    # An approval followed by another edit before the plan saw it is not enough: it may
    # have been given for the earlier text.
    forge.client("alice").create_comment("team", "app", 1, "/aiworker approve")
    edit_issue(forge, 1, body="Fix add(), keep it fast, and say so in the changelog.")
    again = step(cli)
    assert again["state"] == "awaiting_plan_approval"
    assert "a writer must approve again" in again["reason"]
    forge.client("alice").create_comment("team", "app", 1, "/aiworker approve")
    resumed = step(cli)
    assert (resumed["state"], resumed["started"]) == ("milestones", 2)
    assert query(upgraded, "select count(*) from tasks where kind = 'milestone'") == [(2,)]
    # The milestone runs for the newly approved scope (it is not sent back to wait).
    assert cli("poll").exit_code == 0
    assert claim_and_run(cli, "implement", 2)["outcome"] == "implemented"


def test_a_plan_that_breaks_the_bounds_is_not_posted(forge, upgraded, tmp_path, monkeypatch, cli):
    config = configure(tmp_path, forge, monkeypatch)
    bad = [dict(MILESTONES[0], validation=[{"check_id": "x", "command": ["make", "test"]}])]
    scenario = {"phases": {"planning": {"result": result_doc(milestones=bad * 2)}}}
    write_scenario(tmp_path / "scenario.json", **scenario)
    config.write_text(SCRIPT_ONLY + "\n[planning]\nmax_milestones = 1\n" + config.read_text())
    forge.client("alice").add_labels("team", "app", 1, ["aiworker-plan"])
    assert cli("poll").exit_code == 0
    cli("--json", "claim", "--slot", "1")
    result = run_process("--json", "plan", "--task", "1", "--slot", "1")
    assert result.exit_code == 1
    reason = result.json()["reason"]
    assert "the plan proposes 2 milestones; at most 1" in reason
    assert "milestone 1: check x must run ./ci/run" in reason
    assert result.json()["state"] == "ready"  # retried within the planning budget
    assert comments(forge, "planner-bot") == []


def test_a_plan_paused_by_a_withdrawn_label_resumes_where_it_was(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    planned(forge, upgraded, tmp_path, monkeypatch, cli)
    forge.client("alice").create_comment("team", "app", 1, "/aiworker approve")
    assert step(cli)["state"] == "milestones"
    alice = forge.client("alice")
    alice.remove_label("team", "app", 1, "aiworker-plan")
    assert cli("poll").exit_code == 0
    assert query(upgraded, "select state from tasks where id = 1") == [("paused",)]
    alice.add_labels("team", "app", 1, ["aiworker-plan"])
    assert cli("poll").exit_code == 0
    # Not planned again: the approved plan goes on, its milestones made once.
    assert query(upgraded, "select state from tasks where id = 1") == [("milestones",)]
    assert step(cli)["state"] == "milestones"
    assert query(upgraded, "select count(*) from tasks where kind = 'milestone'") == [(2,)]
    assert len(comments(forge, "planner-bot")) == 1


def test_a_plan_made_after_an_edit_poll_has_not_seen_is_not_planned_again(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    config = configure(tmp_path, forge, monkeypatch)
    write_scenario(tmp_path / "scenario.json", **SCENARIO)
    config.write_text(SCRIPT_ONLY + "\n" + config.read_text())
    forge.client("alice").add_labels("team", "app", 1, ["aiworker-plan"])
    assert cli("poll").exit_code == 0
    edit_issue(forge, 1, body="Fix add(), with a test for zero.")  # not polled yet
    assert claim_and_run(cli, "plan", 1)["outcome"] == "planned"
    # The plan answers the text it was made from: it waits for approval, no second plan.
    assert step(cli)["state"] == "awaiting_plan_approval"
    assert query(upgraded, "select count(*) from attempts where phase = 'planning'") == [(1,)]


def test_a_plan_whose_issue_changed_after_its_review_is_approved_again_before_it_merges(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    planned(forge, upgraded, tmp_path, monkeypatch, cli)
    forge.client("alice").add_labels("team", "app", 1, ["aiworker-approved"])
    assert step(cli)["state"] == "milestones"
    claim_and_run(cli, "implement", 2)
    step(cli)
    claim_and_run(cli, "implement", 3)
    assert step(cli)["state"] == "implemented"
    reports = deliver_until(1, "publish", "ci", "review", cli=cli)
    assert all(r.exit_code == 0 for r in reports.values()), reports
    said = len(comments(forge, "worker-bot"))
    edit_issue(forge, 1, body="Fix add(), and keep it fast.")
    assert cli("poll").exit_code == 0  # records the new scope; the approved task waits
    merged = cli("--json", "merge", "--task", "1")
    assert merged.exit_code == 0, merged
    assert (merged.json()["merge_commit"], merged.json()["state"]) == (
        None,
        "awaiting_plan_approval",
    )
    pr = reports["publish"].json()["pr"]
    assert forge.client("alice").pull("team", "app", pr).merged is False
    # The writers are told on the issue; an approval given once the merge step had seen
    # the change counts, before any other step looked (they need not approve twice).
    [told] = comments(forge, "worker-bot")[said:]
    assert told.startswith("The plan is paused: the issue changed after the plan was approved.")
    sent_back = "select actor from events where to_state = 'awaiting_plan_approval'"
    assert query(upgraded, sent_back)[-1] == ("merge",)  # the step that saw the change
    forge.client("alice").create_comment("team", "app", 1, "/aiworker approve")
    for _ in range(3):
        if step(cli)["state"] == "implemented":
            break
    assert query(upgraded, "select state from tasks where id = 1") == [("implemented",)]
    again = deliver_until(1, "publish", "ci", "review", "merge", cli=cli)
    assert all(r.exit_code == 0 for r in again.values()), again
    assert again["publish"].json()["pr"] == pr  # the same PR, reviewed again
    assert forge.client("alice").pull("team", "app", pr).merged


def test_a_plan_step_whose_combined_checks_keep_failing_ends_as_its_budget_says(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    """The combined checks run as a guarded step: each try is an attempt, a failing one
    is retried within the plan's `milestones` budget (delivery), and then the plan fails
    with a comment listing the tries, instead of being retried on every tick."""
    planned(forge, upgraded, tmp_path, monkeypatch, cli)
    config = tmp_path / "config.toml"
    config.write_text(config.read_text() + "[budgets]\ndelivery = 3\n")
    forge.client("alice").add_labels("team", "app", 1, ["aiworker-approved"])
    assert step(cli)["started"] == 2
    claim_and_run(cli, "implement", 2)
    assert step(cli)["started"] == 3
    claim_and_run(cli, "implement", 3)
    monkeypatch.setenv("AIWORKER_FAILPOINT", "milestones.after_checks:raise")
    states = []
    for _ in range(4):
        result = cli("--json", "milestones", "--task", "1")
        states.append(query(upgraded, "select state from tasks where id = 1")[0][0])
    assert states == ["milestones", "milestones", "failed", "failed"], states
    assert result.exit_code == 1  # the plan is failed: no step of it runs any more
    tries = query(
        upgraded, "select outcome, reason from attempts where task_id = 1 and phase = 'milestones'"
    )
    assert tries == [("error", "unexpected FailpointError: failpoint milestones.after_checks")] * 3
    spent = "the milestones budget of 3 attempts is spent"
    [stopped] = [c for c in comments(forge, "worker-bot") if spent in c]
    assert stopped.count("(milestones, host): error") == 3, stopped


def test_a_plan_planned_again_builds_its_new_milestones_on_its_new_base(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    """A plan that failed after a milestone was accepted is retried and planned again:
    its new milestones start from the new plan's base, not from the head the old plan's
    milestones left (where the new first milestone found its work done already)."""
    planned(forge, upgraded, tmp_path, monkeypatch, cli)
    forge.client("alice").add_labels("team", "app", 1, ["aiworker-approved"])
    assert step(cli)["started"] == 2
    claim_and_run(cli, "implement", 2)  # accepted: the plan's head moves
    assert step(cli)["started"] == 3
    assert cli("--json", "task", "cancel", "3").exit_code == 0
    assert step(cli)["state"] == "failed"
    assert cli("--json", "task", "retry", "1").exit_code == 0
    replanned = claim_and_run(cli, "plan", 1)
    assert query(upgraded, "select head_commit from tasks where id = 1") == [(None,)]
    forge.client("alice").create_comment("team", "app", 1, "/aiworker approve")
    first = step(cli)["started"]
    assert first not in (2, 3)
    ran = claim_and_run(cli, "implement", first)
    assert (ran["outcome"], ran["base"]) == ("implemented", replanned["base"]), ran


def first_milestone_running(forge, database, tmp_path, monkeypatch, cli):
    """Plan 1 planned and approved, its first milestone (task 2) claimed on slot 1 and its
    job started, its provider set to sleep 600 s: the job, running."""
    import copy

    from tests.test_lifecycle import start_implement

    planned(forge, database, tmp_path, monkeypatch, cli)
    scenario = copy.deepcopy(SCENARIO)
    scenario["phases"]["implementation"]["by_milestone"]["1"]["sleep_s"] = 600
    write_scenario(tmp_path / "scenario.json", **scenario)
    forge.client("alice").add_labels("team", "app", 1, ["aiworker-approved"])
    assert step(cli)["started"] == 2
    assert cli("--json", "claim", "--slot", "1").json()["task"] == 2
    return start_implement(2)


def test_cancelling_a_plan_stops_and_cancels_its_milestones(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    """An operator cancels a plan while its first milestone's provider runs: that job is
    stopped (no more inference, no checks after it), and every milestone not finished is
    cancelled with the plan, none left waiting for a plan that will never take it."""
    from tests.test_lifecycle import wait_for

    phase = first_milestone_running(forge, upgraded, tmp_path, monkeypatch, cli)
    try:
        wait_for(upgraded, "select id from attempts where task_id = 2 and provider = 'script'")
        cancelled = cli("--json", "task", "cancel", "1")
        assert cancelled.exit_code == 0, cancelled
        assert cancelled.json()["stopped"], cancelled  # the milestone's job
        phase.communicate(timeout=120)  # stopped, not left to sleep out its 600 s
    finally:
        if phase.poll() is None:
            phase.kill()
            phase.wait()
    states = query(upgraded, "select id, state, claim_slot from tasks order by id")
    assert states == [(1, "cancelled", None), (2, "cancelled", None), (3, "cancelled", None)]
    [(outcome,)] = query(upgraded, "select outcome from attempts where task_id = 2")
    assert outcome in ("interrupted", "cancelled")  # closed by its job's guard, or the cancel
    assert cli("--json", "claim", "--slot", "1").json()["claimed"] is False
