"""Two controllers deliver through one PostgreSQL database and one forge: each has its own
state directory (so no file lock of one is seen by the other) and runs real ticks at the
same moments; only the database's locks keep them apart. The task's commits are on the
host that implemented it until published, so only that host publishes it (its first
publish is killed at each of publish's crash points); from there both race for CI, review
and merge: one PR, one status of each kind, one review, one merge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest
import requests

from aiworker.runtime.processes import process_alive
from aiworker.store.engine import Database
from aiworker.store.schema import upgrade
from tests.delivery_fixtures import write_scenario
from tests.helpers import configure, run_process
from tests.pg_fixtures import rows
from tests.test_delivery import REVIEW_OK
from tests.test_implement import FIX, SCRIPT_ONLY, result_doc
from tests.test_lifecycle import attempt_tag, tagged_alive, wait_for_provider

pytestmark = pytest.mark.slow


def tick(config, state, failpoint: str | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "aiworker", "--json", "--config", str(config)]
    return subprocess.Popen(
        [*argv, "--state-dir", str(state), "scheduler", "tick"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # The jobs the tick starts inherit it: the failpoint kills the step that meets it.
        env={**os.environ, **({"AIWORKER_FAILPOINT": failpoint} if failpoint else {})},
    )


def ticks_at_once(hosts, failpoint: str | None = None) -> list[dict]:
    """One tick on every host at the same moment; waits for the jobs they started."""
    procs = [tick(config, state, failpoint) for config, state in hosts]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode in (0, 75), err
        reports.append(json.loads(out))
    pids = [j["pid"] for r in reports for j in r.get("started", []) + r.get("delivering", [])]
    deadline = time.monotonic() + 120
    while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return reports


# Where A's first publish dies: the PRs on the forge then, and the publish attempts in the
# end (a publish killed before its end is recovered as abandoned and run again).
CRASHES = {
    "publish.before_request": (0, [("host-a", "abandoned"), ("host-a", "succeeded")]),
    "publish.after_request": (1, [("host-a", "abandoned"), ("host-a", "succeeded")]),
    "publish.after_record": (1, [("host-a", "succeeded")]),
}


@pytest.mark.parametrize("point", list(CRASHES))
def test_two_controllers_deliver_one_task_once(
    forge, postgres_url, tmp_path, monkeypatch, cli, point
):
    pulls_then, publishes_in_the_end = CRASHES[point]
    db = Database(postgres_url)
    upgrade(db)
    db.dispose()
    config_a = configure(tmp_path, forge, monkeypatch)
    write_scenario(
        tmp_path / "scenario.json",
        edits={"calc.py": FIX},
        result=result_doc(),
        phases={"review": REVIEW_OK},
    )
    shared = f'\n[database]\nurl = "{postgres_url}"\n[scheduler]\nfollow_up = false\n'
    config_a.write_text(SCRIPT_ONLY + config_a.read_text() + shared)
    config_b = tmp_path / "host-b.toml"
    config_b.write_text(config_a.read_text() + '[controller]\nid = "host-b"\n')
    config_a.write_text(config_a.read_text() + '[controller]\nid = "host-a"\n')
    state_a, state_b = tmp_path / "host-a", tmp_path / "host-b"
    a, b = (config_a, state_a), (config_b, state_b)
    polled = run_process("--config", str(config_a), "--state-dir", str(state_a), "poll")
    assert polled.exit_code == 0, polled
    # Host A takes the task on its slot and implements it: the commits are A's alone.
    first = ticks_at_once([a])[0]
    [job] = first["started"]
    task = job["task"]
    assert rows(postgres_url, "select state from tasks") == [("implemented",)]
    # B's tick leaves the publish to A, whose tick is due; A's publish dies (SIGKILL).
    assert ticks_at_once([b])[0]["delivering"] == []
    [crashed] = ticks_at_once([a], failpoint=point)[0]["delivering"]
    assert crashed["phase"] == "publish"
    assert len(forge.client("worker-bot").pulls("team", "app", state="all")) == pulls_then
    # Then both race for the rest: A's next tick recovers a dead step and publishes again,
    # taking a PR it made for its own by its marker.
    for _ in range(12):
        ticks_at_once([a, b])
        if rows(postgres_url, "select state from tasks") == [("done",)]:
            break
    assert rows(postgres_url, "select state from tasks") == [("done",)]
    worker = forge.client("worker-bot")
    [pull] = worker.pulls("team", "app", state="all")
    assert pull.merged
    head = pull.head.sha
    listed = requests.get(
        f"{forge.url}/api/v1/repos/team/app/statuses/{head}",
        headers={"Authorization": f"token {forge.tokens['worker-bot']}"},
        timeout=30,
    )
    statuses = Counter((s["context"], s["status"]) for s in listed.json())
    assert statuses == {("aiworker / ci", "pending"): 1, ("aiworker / ci", "success"): 1}
    reviews = worker.reviews("team", "app", pull.number)
    assert [(r.state, r.user.login) for r in reviews] == [("APPROVED", "reviewer-bot")]
    comments = [c.body for c in worker.comments("team", "app", task)]
    assert len(comments) == len(set(comments))
    steps = rows(
        postgres_url,
        "select phase, host, outcome from attempts where task_id = :task order by id",
        task=task,
    )
    assert [p for p, _, o in steps if o == "succeeded"] == [
        "implementation", "publish", "ci", "review", "merge"
    ]  # fmt: skip
    assert steps[0][1] == "host-a"  # implemented there, and
    publishes = [(h, o) for p, h, o in steps if p == "publish"]
    assert publishes == publishes_in_the_end  # published there
    assert run_process("--json", "--state-dir", str(state_b), "status").exit_code == 0


def test_a_database_restart_while_a_job_runs_costs_no_finished_work(
    forge, postgres, postgres_url, tmp_path, monkeypatch, state_dir
):
    """PostgreSQL stops while the agent works and is back a few seconds later: the job
    waits for it at its next record and finishes; nothing is abandoned or charged twice."""
    db = Database(postgres_url)
    upgrade(db)
    db.dispose()
    config = configure(tmp_path, forge, monkeypatch)
    write_scenario(
        tmp_path / "scenario.json", edits={"calc.py": FIX}, result=result_doc(), sleep_s=6
    )
    config.write_text(SCRIPT_ONLY + config.read_text() + f'\n[database]\nurl = "{postgres_url}"\n')
    assert run_process("poll").exit_code == 0
    claim = run_process("--json", "claim", "--slot", "1").json()
    argv = [sys.executable, "-m", "aiworker", "--json", "implement", "--slot", "1"]
    job = subprocess.Popen(
        [*argv, "--task", str(claim["task"])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The agent runs (its workspace recorded, its process up): nothing is being
        # written now, and the job's next record comes when the agent ends.
        deadline = time.monotonic() + 120
        query = "select id from attempts where workspace_path is not null"
        while not (found := rows(postgres_url, query)):
            assert time.monotonic() < deadline, "the agent never started"
            time.sleep(0.1)
        tag = attempt_tag(state_dir, found[0][0])
        wait_for_provider(tag)
        postgres.stop("fast")
        while tagged_alive(tag):  # the agent ends while the database is down
            assert time.monotonic() < deadline + 120, "the agent never ended"
            time.sleep(0.1)
        time.sleep(3)  # and the job meets the outage at its next record
    finally:
        postgres.start()
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, (out, err)
    assert json.loads(out)["state"] == "implemented"
    assert rows(postgres_url, "select outcome, refunded from attempts") == [("succeeded", False)]
    assert rows(postgres_url, "select state from tasks") == [("implemented",)]
    assert "waiting for it" in err
