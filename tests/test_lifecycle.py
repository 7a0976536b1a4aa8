"""The lifecycle against the sandbox forge: inputs checked before inference, pauses that
hold, budgets, recovery of dead jobs, and the operator's retry and cancel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import run_process
from tests.json_keys import assert_keys
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc


def edit_issue(forge, number: int, **fields) -> None:
    forge.as_user("alice", "PATCH", f"/issues/{number}", fields)


def comments_by_worker(forge, number: int = 1) -> list[str]:
    return [
        c.body
        for c in forge.client("alice").comments("team", "app", number)
        if c.user.login == "worker-bot"
    ]


def start_implement(task: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aiworker",
            "--json",
            "implement",
            "--task",
            str(task),
            "--slot",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(db: Path, sql: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = query(db, sql)
        if rows and rows[0][0]:
            return rows[0]
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {sql}")


def tagged_alive(tag: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            if tag.encode() in environ and stat[stat.rfind(b")") + 2 :][:1] != b"Z":
                found.append(int(entry))
    return found


def attempt_tag(state_dir: Path, attempt: int) -> str:
    """The tag the implementation attempt's processes carry (unique to this state dir)."""
    from aiworker.config.loader import load_config
    from aiworker.core.context import Environment

    env = Environment(state_dir, load_config(state_dir / "absent.toml", required=False))
    return f"AIWORKER_ATTEMPT_ID={env.attempt_tag('implementation', attempt)}"


def wait_for_provider(tag: str) -> list[int]:
    """The provider's processes once it runs steadily: the same set on two reads half a
    second apart, so that its own short-lived children (the scenario's git commit) have
    come and gone and are not taken for processes that must be stopped."""
    deadline = time.monotonic() + 30
    previous = None
    while time.monotonic() < deadline:
        found = sorted(tagged_alive(tag))
        if found and found == previous:
            return found
        previous = found
        time.sleep(0.5)
    raise AssertionError(f"the provider should be running steadily: {previous}")


def test_a_malformed_checks_block_waits_for_input_and_spends_nothing(forge, claimed, upgraded, cli):
    edit_issue(forge, 1, body="Fix add().\n\n```aiworker-checks\nunit ./ci/run\n```\n")
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert result.exit_code == 1, result
    report = result.json()
    assert (report["outcome"], report["attempt"], report["provider"]) == ("needs_input", None, None)
    assert "aiworker-checks line 1" in report["reason"]
    assert query(upgraded, "select state, claim_slot from tasks") == [("needs_input", None)]
    assert query(upgraded, "select count(*) from attempts") == [(0,)]
    assert query(upgraded, "select count(*) from provider_observations where window = 'run'") == [
        (0,)
    ]
    [comment] = comments_by_worker(forge)
    assert "nothing was run" in comment
    assert "aiworker-checks line 1: expected 'check_id: ./ci/run ARGS'" in comment
    # Nothing is claimed for it again until the issue changes.
    assert cli("--json", "claim", "--slot", "1").json()["claimed"] is False
    edit_issue(forge, 1, body="Fix add().\n\n```aiworker-checks\nunit: ./ci/run\n```\n")
    polled = cli("--json", "poll").json()
    assert_keys("poll", polled)
    assert polled["tasks"] == {"updated": 1}
    assert query(upgraded, "select state from tasks") == [("ready",)]


def test_a_base_without_ci_run_waits_for_input(forge, claimed, upgraded, tmp_path):
    from tests.forge_fixtures import git

    work = tmp_path / "clone"
    git("clone", "-q", forge.clone_url("alice"), str(work))
    git("rm", "-q", "ci/run.sh", cwd=work)
    git("commit", "-qm", "Drop CI", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    report = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert report["outcome"] == "needs_input"
    assert "has no executable `ci/run`" in report["reason"]
    assert query(upgraded, "select count(*) from attempts") == [(0,)]


def test_a_task_paused_during_its_run_stays_paused_with_its_result_kept(
    forge, claimed, upgraded, state_dir, cli
):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc(), sleep_s=6)
    phase = start_implement(task)
    _, attempt = wait_for(upgraded, "select workspace_path, id from attempts")
    wait_for_provider(attempt_tag(state_dir, attempt))
    edit_issue(forge, 1, assignees=[])  # the writer withdraws the assignment
    assert cli("--json", "poll").json()["paused"][0]["task"] == task
    out, err = phase.communicate(timeout=60)
    assert phase.returncode == 1, err
    report = json.loads(out)
    assert (report["outcome"], report["state"]) == ("retained", "paused")
    assert query(upgraded, "select state, claim_slot from tasks") == [("paused", None)]
    assert query(upgraded, "select outcome, finished_at is not null from attempts") == [
        ("succeeded", 1)
    ]
    [kept] = query(upgraded, "select data from events where kind = 'workspace.kept'")
    workspace = Path(json.loads(kept[0])["path"])
    assert "paused while the phase ran" in json.loads(kept[0])["reason"]
    assert (workspace / "repo" / "calc.py").read_text() == FIX
    assert not (workspace / "home").exists()


def test_a_result_for_a_scope_replaced_during_its_run_is_retained_and_the_task_waits_again(
    forge, claimed, upgraded, state_dir, cli
):
    """Poll records an edited issue while the implementation runs: the result answers the
    old scope, so it is kept, not accepted, and the task waits for a slot again instead
    of staying claimed by a job that has ended."""
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc(), sleep_s=6)
    phase = start_implement(task)
    _, attempt = wait_for(upgraded, "select workspace_path, id from attempts")
    wait_for_provider(attempt_tag(state_dir, attempt))
    edit_issue(forge, 1, body="Fix add(), and keep sub() as it is.")
    assert cli("--json", "poll").json()["tasks"] == {"updated": 1}
    out, err = phase.communicate(timeout=60)
    assert phase.returncode == 1, err
    report = json.loads(out)
    assert (report["outcome"], report["state"]) == ("retained", "ready")
    assert report["reason"] == "the issue changed while the phase ran; its result is retained"
    assert query(upgraded, "select state, claim_slot, head_commit from tasks") == [
        ("ready", None, None)
    ]
    [kept] = query(upgraded, "select data from events where kind = 'workspace.kept'")
    assert "the issue changed while the phase ran" in json.loads(kept[0])["reason"]


# Two providers that both fail: the first backs off after its failure, the second takes
# the next attempt, and the budget of two is then spent.
TWO_FAILING = (
    '\nproviders = ["script", "codex"]\n[provider_options.script]\nscenario = "scenario.json"\n'
    '[provider_options.codex]\nscenario = "scenario.json"\n[budgets]\nimplementation = 2\n'
)


def test_a_spent_budget_fails_the_task_with_a_comment_and_retry_resets_it(
    forge, claimed, upgraded, cli
):
    task = claimed(TWO_FAILING, edits={"calc.py": FIX}, failure="transient")
    first = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert (first["provider"], first["outcome"], first["state"]) == ("script", "transient", "ready")
    assert cli("--json", "claim", "--slot", "1").json()["claimed"]
    second = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert (second["provider"], second["outcome"], second["state"]) == (
        "codex",
        "transient",
        "failed",
    )
    assert query(upgraded, "select state from tasks") == [("failed",)]
    assert query(upgraded, "select phase, used from budgets") == [("implementation", 2)]
    [comment] = comments_by_worker(forge)
    assert "the implementation budget of 2 attempts is spent" in comment
    assert "Traceback" not in comment  # no line of this host's log on the issue
    assert "(implementation, script): transient" in comment
    assert "(implementation, codex): transient" in comment
    shown = cli("--json", "task", "show", str(task)).json()
    assert [a["outcome"] for a in shown["attempts"]] == ["transient", "transient"]
    assert shown["budgets"] == {"implementation": {"used": 2, "resets": 0, "limit": 2}}
    retried = cli("--json", "task", "retry", str(task))
    assert retried.exit_code == 0, retried
    assert_keys("task retry", retried.json())
    assert retried.json()["budget_reset"] == {"implementation": 2}
    assert query(upgraded, "select state from tasks") == [("ready",)]
    assert query(upgraded, "select used, resets from budgets") == [(0, 1)]
    again = cli("--json", "task", "retry", str(task))
    assert again.exit_code == 1
    assert "only failed or needs_input tasks" in again.json()["error"]["message"]


REQUEST = {"cause": "review", "start": "cd" * 20, "base": "ef" * 20, "findings": []}


def test_a_retry_resumes_only_a_step_whose_own_budget_ran_out(upgraded, cli):
    """Where each failed task is retried: a step that spent its own budget where it
    failed (its work kept), a repair that ran out as the episode it was refused; a
    failure the work decided (a plan stopped, its milestones cancelled) or an
    implemented head this controller does not hold from ready, as before."""
    from aiworker.core.tasks.lifecycle import advance
    from aiworker.store.engine import Database
    from aiworker.store.task_records import create_task, ensure_repository

    cases = {
        # kind, the state it failed in, what the failure recorded, where a retry goes
        1: ("issue", "awaiting_ci", {"phase": "ci", "used": 3, "limit": 3}, "awaiting_ci"),
        2: ("issue", "approved", {"phase": "merge", "used": 3, "limit": 3}, "approved"),
        3: ("plan", "milestones", {}, "ready"),  # the plan's step decided to stop
        4: ("issue", "awaiting_review", {"phase": "repair", "used": 3, **REQUEST}, "repairing"),
        5: ("issue", "implemented", {"phase": "publish", "used": 3, "limit": 3}, "ready"),
    }
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        for number, (kind, state, data, _) in cases.items():
            task = create_task(session, repo.id, kind, issue_number=number, state=state)
            task.head_commit = "ab" * 20  # in no git cache here
            advance(session, task.id, state, task.version, "failed", "x", data=data)
    db.dispose()
    for number, (_, _, _, expected) in cases.items():
        retried = cli("--json", "task", "retry", str(number))
        assert retried.exit_code == 0, retried
        assert retried.json()["state"] == expected, number
    assert query(upgraded, "select count(*) from tasks where state = 'failed'") == [(0,)]


def test_a_killed_job_is_recovered_as_an_abandoned_attempt_and_counted(
    forge, claimed, upgraded, state_dir, cli
):
    budget = "\n[budgets]\nimplementation = 2\n"
    task = claimed(SCRIPT_ONLY + budget, edits={"calc.py": FIX}, result=result_doc(), sleep_s=30)
    phase = start_implement(task)
    workspace, attempt = wait_for(upgraded, "select workspace_path, id from attempts")
    tag = attempt_tag(state_dir, attempt)
    wait_for_provider(tag)
    phase.send_signal(signal.SIGKILL)
    phase.communicate()
    assert query(upgraded, "select count(*) from attempts where finished_at is null") == [(1,)]
    # What a launched job's output leaves in the task's log: for operators, not issues.
    log = state_dir / "logs" / f"task-{task}.log"
    log.parent.mkdir(exist_ok=True)
    with log.open("a") as handle:
        handle.write('Traceback (most recent call last):\n  File "/srv/aiworker/job.py"\n')
    # The next claim on the slot recovers it first (a tick does the same).
    claim = cli("--json", "claim", "--slot", "1").json()
    assert_keys("claim", claim)
    assert claim["recovered"] == [task]
    outcome, reason = query(upgraded, "select outcome, reason from attempts")[0]
    assert outcome == "abandoned"
    assert reason.startswith("the job's process died: last recorded: attempt.started")
    assert "log tail" not in reason  # the log is the operator's: with the event alone
    [(data,)] = query(upgraded, "select data from events where kind = 'attempt.abandoned'")
    assert "/srv/aiworker/job.py" in json.loads(data)["log_tail"]
    assert tagged_alive(tag) == [], "the provider's processes die with the attempt"
    assert not Path(workspace).exists()
    assert query(upgraded, "select path, action from cleanup_inventory") == [(workspace, "removed")]
    assert query(upgraded, "select phase, used from budgets") == [("implementation", 1)]
    assert query(upgraded, "select state from tasks") == [("claimed",)]
    # Relaunched, it dies again: the budget is spent and the task fails, explained.
    again = start_implement(task)
    wait_for(upgraded, "select count(*) >= 2 from attempts where workspace_path is not null")
    again.send_signal(signal.SIGKILL)
    again.communicate()
    assert cli("--json", "claim", "--slot", "1").json()["recovered"] == [task]
    assert query(upgraded, "select state, claim_slot from tasks") == [("failed", None)]
    assert query(upgraded, "select outcome from attempts") == [("abandoned",), ("abandoned",)]
    [comment] = comments_by_worker(forge)
    assert "the implementation budget of 2 attempts is spent" in comment
    assert "Traceback" not in comment  # no line of this host's log on the issue


def test_a_claim_made_by_hand_keeps_its_slot_through_the_grace_period(claimed, upgraded, cli):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    tick = cli("--json", "scheduler", "tick")
    assert tick.exit_code == 0, tick
    report = tick.json()
    assert (report["recovered"], report["started"]) == ([], [])
    assert query(upgraded, "select id, state, claim_slot from tasks") == [(task, "claimed", 1)]


def test_cancel_stops_the_running_job_and_leaves_nothing_alive(claimed, upgraded, state_dir):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc(), sleep_s=60)
    phase = start_implement(task)
    workspace, attempt = wait_for(upgraded, "select workspace_path, id from attempts")
    tag = attempt_tag(state_dir, attempt)
    agents = wait_for_provider(tag)
    cancelled = run_process("--json", "task", "cancel", str(task))
    assert cancelled.exit_code == 0, cancelled
    report = cancelled.json()
    assert_keys("task cancel", report)
    assert report["was"] == "running"
    assert phase.pid in report["stopped"]
    assert set(agents) <= set(report["stopped"])
    phase.communicate(timeout=30)
    assert tagged_alive(tag) == []
    assert not Path(f"/proc/{phase.pid}").exists()
    assert query(upgraded, "select state, claim_slot from tasks") == [("cancelled", None)]
    [(outcome, finished)] = query(upgraded, "select outcome, finished_at is not null from attempts")
    assert finished == 1
    assert outcome in ("interrupted", "cancelled")
    assert not Path(workspace).exists()
    assert run_process("--json", "task", "cancel", str(task)).exit_code == 1


def test_a_job_an_operator_stops_from_the_page_is_recorded_and_not_charged(
    forge, claimed, upgraded, state_dir
):
    """The page's "stop the slot's job": the stop is recorded as the operator's, its
    attempt closed as stopped with the budget charge given back, and the task waits for
    a slot again. Before, only the SIGTERM showed in its history, and three stops failed
    the task as "budget spent"."""
    from tests.test_web_api import serving, session

    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc(), sleep_s=60)
    phase = start_implement(task)
    try:
        _, attempt = wait_for(upgraded, "select workspace_path, id from attempts")
        wait_for_provider(attempt_tag(state_dir, attempt))
        with serving() as url:
            stop = {"slot": 1, "confirm": True}
            stopped = session(url).post(f"{url}/api/v1/actions/stop-slot", json=stop)
            assert stopped.status_code == 200, stopped.text
        phase.communicate(timeout=120)  # stopped, not left to sleep out its 60 s
    finally:
        if phase.poll() is None:
            phase.kill()
            phase.wait()
    assert query(upgraded, "select state, claim_slot from tasks") == [("ready", None)]
    assert query(upgraded, "select outcome, refunded from attempts") == [("stopped", 1)]
    asked = "select actor, data from events where kind = 'slot.stop_requested'"
    [(actor, data)] = query(upgraded, asked)
    assert actor == "the web control plane"
    assert json.loads(data)["slot"] == 1
    [(reason,)] = query(upgraded, "select reason from attempts")
    assert reason == "stopped by an operator (the web control plane) on slot 1"
    [(retried,)] = query(upgraded, "select data from events where kind = 'task.retry_scheduled'")
    assert json.loads(retried)["used"] == 0
