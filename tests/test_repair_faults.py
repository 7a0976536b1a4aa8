"""SIGKILL a planning and a repair phase through real ticks: recovery closes the attempt,
counts it, and the next tick starts the phase again from where the task was; the plan is
posted once and the repaired work still ends in a merged PR."""

from __future__ import annotations

import pytest

from tests.delivery_fixtures import write_scenario
from tests.helpers import configure, run_process
from tests.test_delivery import REVIEW_BLOCKING, REVIEW_OK
from tests.test_fault_injection import CONFIG, assert_nothing_unexplained, state_of, tick
from tests.test_implement import FIX, query, result_doc
from tests.test_plan import MILESTONES, comments
from tests.test_repair import MORE_TESTS


def ticks_until(cli, monkeypatch, db, state, limit=12):
    for _ in range(limit):
        if state_of(db) == state:
            return
        tick(cli, monkeypatch)
    assert state_of(db) == state


@pytest.mark.slow
def test_a_killed_repair_is_recovered_and_run_again(
    cli, forge, upgraded, state_dir, tmp_path, monkeypatch
):
    config = configure(tmp_path, forge, monkeypatch)
    config.write_text(CONFIG + config.read_text())
    write_scenario(
        tmp_path / "scenario.json",
        edits={"calc.py": FIX},
        result=result_doc(),
        phases={
            "review": [REVIEW_BLOCKING, REVIEW_OK],
            "repair": {"edits": {"test_calc.py": MORE_TESTS}, "result": result_doc()},
        },
    )
    assert run_process("poll").exit_code == 0
    ticks_until(cli, monkeypatch, upgraded, "repairing")
    for number, point in enumerate(["repair.attempt_started", "repair.after_run"]):
        report = tick(cli, monkeypatch, point)
        assert [r["task"] for r in report["recovered"]] == ([1] if number else [])
        assert [s["task"] for s in report["started"]] == [1]  # claimed for a slot again
        assert query(upgraded, "select phase from attempts where finished_at is null") == [
            ("repair",)
        ]
        assert_nothing_unexplained(upgraded, state_dir)
    report = tick(cli, monkeypatch)
    assert [r["state"] for r in report["recovered"]] == ["repairing"]
    assert state_of(upgraded) == "implemented"
    ticks_until(cli, monkeypatch, upgraded, "done")
    assert query(upgraded, "select outcome from attempts where phase = 'repair'") == [
        ("abandoned",),
        ("abandoned",),
        ("succeeded",),
    ]
    assert query(upgraded, "select used from budgets where phase = 'repair'") == [(3,)]
    assert query(upgraded, "select count(*) from attempts where finished_at is null") == [(0,)]


@pytest.mark.slow
def test_a_killed_planning_phase_is_recovered_and_the_plan_posted_once(
    cli, forge, upgraded, state_dir, tmp_path, monkeypatch
):
    config = configure(tmp_path, forge, monkeypatch)
    config.write_text(CONFIG + config.read_text())
    plan = {"result": result_doc(summary="Two steps", milestones=MILESTONES)}
    write_scenario(tmp_path / "scenario.json", phases={"planning": plan})
    forge.client("alice").add_labels("team", "app", 1, ["aiworker-plan"])
    assert run_process("poll").exit_code == 0
    tick(cli, monkeypatch, "planning.after_run")
    assert query(upgraded, "select phase from attempts where finished_at is null") == [
        ("planning",)
    ]
    report = tick(cli, monkeypatch)
    assert [(r["task"], r["state"]) for r in report["recovered"]] == [(1, "ready")]
    assert state_of(upgraded) == "awaiting_plan_approval"
    assert len(comments(forge, "planner-bot")) == 1
    assert query(upgraded, "select outcome from attempts where phase = 'planning'") == [
        ("abandoned",),
        ("succeeded",),
    ]
    assert_nothing_unexplained(upgraded, state_dir)
