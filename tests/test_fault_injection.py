"""SIGKILL every model phase and every delivery step at several points, through real ticks:
after each tick the task is in a defined state, no attempt stays open once recovery ran,
nothing is left on disk without a recorded reason, and the budget shows every attempt."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from aiworker.runtime.failpoints import POINTS
from aiworker.runtime.processes import process_alive
from tests.delivery_fixtures import write_scenario
from tests.helpers import configure, run_process
from tests.test_delivery import REVIEW_OK
from tests.test_implement import FIX, query, result_doc

CONFIG = (
    '\nproviders = ["script"]\n[provider_options.script]\nscenario = "scenario.json"\n'
    "[scheduler]\nfollow_up = false\n"
    # Each kill counts against its step's budget: room for every point and the run after.
    "[budgets]\nimplementation = 6\nreview = 6\ndelivery = 6\n"
)
# In delivery order, every registered point of every step of an issue's way (the attempt's
# phase: the step's points); each kills the job there once, then a tick recovers it.
FAULTS = {
    "implementation": POINTS["implement"],
    "publish": POINTS["publish"],
    "ci": POINTS["ci"],
    "review": POINTS["review"],
    "merge": POINTS["merge"],
}
# Points after the step recorded its outcome: the job dies with nothing left open.
AFTER_OUTCOME = {"publish.after_record"}
DEFINED = {
    "ready",
    "claimed",
    "implemented",
    "awaiting_ci",
    "awaiting_review",
    "approved",
    "done",
}


def tick(cli, monkeypatch, failpoint: str | None = None) -> dict:
    """One real tick (in this process; its jobs are processes of their own, which inherit
    the failpoint); wait for the jobs it started to end, killed or finished."""
    with monkeypatch.context() as scoped:
        if failpoint:
            scoped.setenv("AIWORKER_FAILPOINT", failpoint)
        result = cli("--json", "scheduler", "tick")
    assert result.exit_code == 0, result
    report = result.json()
    pids = [j["pid"] for j in report["started"] + report["delivering"]]
    deadline = time.monotonic() + 60
    while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return report


def state_of(db) -> str:
    return query(db, "select state from tasks")[0][0]


def assert_nothing_unexplained(db, state_dir: Path) -> None:
    """Every workspace on disk belongs to an open attempt (which recovery will close), or
    was kept with a recorded reason and without its private home."""
    workspaces = state_dir / "workspaces"
    open_paths = {
        p for (p,) in query(db, "select workspace_path from attempts where finished_at is null")
    }
    kept = [row[0] for row in query(db, "select data from events where kind = 'workspace.kept'")]
    for path in workspaces.iterdir() if workspaces.exists() else []:
        if str(path) in open_paths or not path.is_dir():
            continue
        assert any(str(path) in k for k in kept), f"{path} is there without a reason"
        assert not (path / "home").exists(), f"{path} still has a private home"


@pytest.mark.slow
def test_killed_jobs_are_recovered_at_every_point(
    cli, forge, upgraded, state_dir, tmp_path, monkeypatch
):
    config = configure(tmp_path, forge, monkeypatch)
    config.write_text(CONFIG + config.read_text())
    write_scenario(
        tmp_path / "scenario.json",
        edits={"calc.py": FIX},
        result=result_doc(),
        phases={"review": REVIEW_OK},
    )
    assert run_process("poll").exit_code == 0
    [(task,)] = query(upgraded, "select id from tasks")
    killed = 0
    for phase, points in FAULTS.items():
        # Each tick first recovers what the previous one's job left, then starts the
        # step again, this time to be killed at the next point.
        left_open = False
        for point in points:
            if point in AFTER_OUTCOME:
                continue  # below, once the step has run to its end
            report = tick(cli, monkeypatch, point)
            assert [r["task"] for r in report["recovered"]] == ([task] if left_open else [])
            killed += 1
            left_open = True
            assert query(upgraded, "select phase from attempts where finished_at is null") == [
                (phase,)
            ], point
            assert_nothing_unexplained(upgraded, state_dir)
        last = next((p for p in points if p in AFTER_OUTCOME), None)
        report = tick(cli, monkeypatch, last)  # recovered; the step runs to its end
        assert [r["task"] for r in report["recovered"]] == [task]
        assert state_of(upgraded) in DEFINED
        assert query(upgraded, "select count(*) from attempts where finished_at is null") == [(0,)]
        assert_nothing_unexplained(upgraded, state_dir)
    for _ in range(10):
        if state_of(upgraded) == "done":
            break
        tick(cli, monkeypatch)
    assert state_of(upgraded) == "done"
    tick(cli, monkeypatch)  # cleanup after delivery
    assert query(upgraded, "select count(*) from attempts where finished_at is null") == [(0,)]
    assert query(upgraded, "select count(*) from attempts where outcome = 'abandoned'") == [
        (killed,)
    ]
    for phase, used in query(upgraded, "select phase, used from budgets"):
        counted = query(
            upgraded,
            f"select count(*) from attempts where phase = '{phase}' and refunded = 0",
        )[0][0]
        assert used == counted, phase
    for (reason,) in query(upgraded, "select reason from attempts where outcome = 'abandoned'"):
        assert reason.startswith("the job's process died: last recorded:"), reason
    assert not any((state_dir / "workspaces").iterdir())
    head = query(upgraded, "select head_commit from tasks")[0][0]
    worker = forge.client("worker-bot")
    statuses = worker.combined_status("team", "app", head)
    assert statuses.state == "success"
    # No forge write was made twice for one reason: one PR, one review, one merge, one
    # terminal CI status (each killed CI run's pending one got its terminal error).
    [pull] = worker.pulls("team", "app", state="all")
    assert pull.merged
    [review] = worker.reviews("team", "app", pull.number)
    assert (review.state, review.commit_id) == ("APPROVED", head)
    with forge.app.state.lock:
        posted = forge.app.state.repo("team", "app")["statuses"].get(head, [])
        finals = [item["state"] for item in posted if item["state"] != "pending"]
    assert finals.count("success") == 1, finals
    assert os.listdir(state_dir / "logs") == []


PLAN_DEFINED = DEFINED | {"awaiting_plan_approval", "milestones", "planning", "repairing"}


@pytest.mark.slow
def test_killed_plan_jobs_are_recovered_at_every_point(
    cli, forge, upgraded, state_dir, tmp_path, monkeypatch
):
    from tests.test_plan import SCENARIO

    config = configure(tmp_path, forge, monkeypatch)
    # The combined checks' step is killed at two points, four ticks each: room for all.
    budgets = CONFIG.replace("review = 6", "review = 6\nplanning = 6")
    config.write_text(budgets.replace("delivery = 6", "delivery = 12") + config.read_text())
    write_scenario(tmp_path / "scenario.json", **SCENARIO)
    forge.client("alice").add_labels("team", "app", 1, ["aiworker-plan"])
    assert run_process("poll").exit_code == 0
    plan = 1
    for point in POINTS["plan"]:
        tick(cli, monkeypatch, point)
        assert state_of(upgraded) in PLAN_DEFINED, point
        assert_nothing_unexplained(upgraded, state_dir)
    for _ in range(3):  # recovered, and the plan is posted (once)
        if query(upgraded, f"select state from tasks where id = {plan}") == [
            ("awaiting_plan_approval",)
        ]:
            break
        tick(cli, monkeypatch)
    assert query(upgraded, f"select state from tasks where id = {plan}") == [
        ("awaiting_plan_approval",)
    ]
    comments = forge.client("alice").comments("team", "app", 1)
    plans = [c for c in comments if c.user.login == "planner-bot" and "proposes" in c.body]
    assert len(plans) == 1, [c.body[:80] for c in plans]
    # The planner ran for the first three points only: once its plan was recorded, the
    # runs after a kill posted (or found) it without running the planner again.
    assert query(upgraded, "select count(*) from events where kind = 'plan.decided'") == [(1,)]
    ran = "select count(*) from attempts where phase = 'planning' and provider is not null"
    assert query(upgraded, ran) == [(3,)]
    forge.client("alice").add_labels("team", "app", 1, ["aiworker-approved"])
    # Each milestones point kills the step wherever it passes it, for a few ticks.
    for point in POINTS["milestones"]:
        for _ in range(4):
            tick(cli, monkeypatch, point)
            assert query(upgraded, f"select state from tasks where id = {plan}")[0][0] in (
                PLAN_DEFINED
            )
    for _ in range(25):
        if query(upgraded, f"select state from tasks where id = {plan}") == [("done",)]:
            break
        tick(cli, monkeypatch)
    assert query(upgraded, f"select state from tasks where id = {plan}") == [("done",)]
    assert query(upgraded, "select count(*) from attempts where finished_at is null") == [(0,)]
    [pull] = forge.client("worker-bot").pulls("team", "app", state="all")
    assert pull.merged


@pytest.mark.slow
def test_killed_repair_episodes_are_recovered_at_every_point(
    cli, forge, upgraded, state_dir, tmp_path, monkeypatch
):
    from tests.test_delivery import REVIEW_BLOCKING
    from tests.test_repair import MORE_TESTS

    config = configure(tmp_path, forge, monkeypatch)
    config.write_text(CONFIG.replace("review = 6", "review = 6\nrepair = 6") + config.read_text())
    repair = {"edits": {"test_calc.py": MORE_TESTS}, "result": result_doc()}
    write_scenario(
        tmp_path / "scenario.json",
        edits={"calc.py": FIX},
        result=result_doc(),
        phases={"review": [REVIEW_BLOCKING, REVIEW_OK], "repair": repair},
    )
    assert run_process("poll").exit_code == 0
    for _ in range(10):  # implemented, published, tested, and changes requested
        if state_of(upgraded) == "repairing":
            break
        tick(cli, monkeypatch)
    assert state_of(upgraded) == "repairing"
    for point in POINTS["repair"]:
        tick(cli, monkeypatch, point)
        assert state_of(upgraded) in DEFINED | {"repairing"}, point
        assert_nothing_unexplained(upgraded, state_dir)
    for _ in range(12):
        if state_of(upgraded) == "done":
            break
        tick(cli, monkeypatch)
    assert state_of(upgraded) == "done"
    assert query(upgraded, "select count(*) from attempts where finished_at is null") == [(0,)]
    killed = query(upgraded, "select count(*) from attempts where outcome = 'abandoned'")
    assert killed == [(len(POINTS["repair"]),)]
    worker = forge.client("worker-bot")
    [pull] = worker.pulls("team", "app", state="all")
    assert pull.merged
    reviews = [r.state for r in worker.reviews("team", "app", pull.number)]
    assert reviews == ["REQUEST_CHANGES", "APPROVED"]
