"""From an implemented task to a merged PR: publish, CI, independent review, merge."""

from __future__ import annotations

import hashlib
import html
import os
import shutil
from pathlib import Path

import pytest
import requests

from tests.forge_fixtures import git
from tests.helpers import configure, run_process
from tests.json_keys import assert_keys
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc
from tests.test_lifecycle import edit_issue
from tests.test_web_api import serving

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


def deliver_until(task, *steps, cli=None):
    """Run delivery steps in order (in this process when CLI is given), up to a failure."""
    run = cli or run_process
    reports = {}
    for step in steps:
        result = run("--json", step, "--task", str(task))
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
        assert_keys("implement", implemented.json())
        return task, implemented.json()["head"]

    return run


def test_issue_to_merged_pr(forge, delivered, upgraded, cli):
    task, head = delivered()
    reports = deliver_until(task, "publish", "ci", "review", "merge", cli=cli)
    for step, result in reports.items():
        assert result.exit_code == 0, (step, result)
        assert_keys(step, result.json())
    pr = reports["publish"].json()["pr"]
    worker = forge.client("worker-bot")
    combined = worker.combined_status("team", "app", head)
    assert (combined.state, combined.statuses[0].context) == ("success", "aiworker / ci")
    # No web.public_url: no link at all (a path on the controller's disk is none).
    assert combined.statuses[0].target_url == ""
    assert reports["ci"].json()["receipt_url"] == ""
    evidence = reports["ci"].json()["evidence"]
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
    shown = cli("--json", "task", "show", str(task)).json()
    assert_keys("task show", shown)
    kinds = [e["kind"] for e in shown["history"]]
    assert kinds[:3] == ["task.created", "task.scope_recorded", "task.claimed"]
    for kind in ("attempt.started", "task.published", "ci.finished", "review.posted"):
        assert kind in kinds
    assert kinds[-2:] == ["attempt.finished", "merge.done"]
    assert [(a["phase"], a["outcome"]) for a in shown["attempts"]] == [
        ("implementation", "succeeded"),
        ("publish", "succeeded"),
        ("ci", "succeeded"),
        ("review", "succeeded"),
        ("merge", "succeeded"),
    ]
    assert shown["publications"] == [
        {"state": "merged", "branch": f"aiworker/task-{task}", "pr": pr, "head": head}
    ]
    human = cli("task", "show", str(task)).stdout
    assert "merge.done approved -> done" in human
    assert f"publication: merged aiworker/task-{task} PR #{pr} at {head[:12]}" in human


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


def test_every_pending_ci_status_gets_a_terminal_one(forge, delivered, upgraded):
    task, head = delivered()
    assert run_process("publish", "--task", str(task)).exit_code == 0
    worker = forge.client("worker-bot")
    failed = run_process(
        "--json", "ci", "--task", str(task), env={"AIWORKER_FAILPOINT": "ci.after_pending:raise"}
    )
    assert failed.exit_code == 1, failed
    assert "failpoint ci.after_pending" in failed.json()["error"]["message"]
    combined = worker.combined_status("team", "app", head)
    assert combined.state == "error"
    assert combined.statuses[0].description.startswith(
        "aiworker could not finish ./ci/run: unexpected FailpointError"
    )
    assert query(upgraded, "select outcome from attempts where phase = 'ci'") == [("error",)]
    assert query(upgraded, "select state from tasks") == [("awaiting_ci",)]
    # A run whose process dies after `pending` gets its terminal status from recovery.
    killed = run_process(
        "--json", "ci", "--task", str(task), env={"AIWORKER_FAILPOINT": "ci.after_pending"}
    )
    assert killed.exit_code == -9
    assert worker.combined_status("team", "app", head).state == "pending"
    assert run_process("scheduler", "pause").exit_code == 0
    recovered = run_process("--json", "scheduler", "tick").json()["recovered"]
    assert [(r["task"], r["state"]) for r in recovered] == [(task, "awaiting_ci")]
    combined = worker.combined_status("team", "app", head)
    assert combined.state == "error"
    assert "the job's process died" in combined.statuses[0].description
    assert query(upgraded, "select outcome from attempts where phase = 'ci' order by id") == [
        ("error",),
        ("abandoned",),
    ]
    assert run_process("scheduler", "resume").exit_code == 0
    passed = run_process("--json", "ci", "--task", str(task))
    assert passed.exit_code == 0, passed
    assert worker.combined_status("team", "app", head).state == "success"


def test_cancelling_a_published_task_leaves_its_pr_open_with_a_comment(
    forge, delivered, upgraded, cli
):
    task, _head = delivered()
    reports = deliver_until(task, "publish", "ci", cli=cli)
    assert all(r.exit_code == 0 for r in reports.values())
    pr = reports["publish"].json()["pr"]
    cancelled = cli("--json", "task", "cancel", str(task))
    assert cancelled.exit_code == 0, cancelled
    assert_keys("task cancel", cancelled.json())
    assert cancelled.json()["was"] == "awaiting_review"
    worker = forge.client("worker-bot")
    assert worker.pull("team", "app", pr).state == "open"
    [comment] = [c for c in worker.comments("team", "app", pr) if c.user.login == "worker-bot"]
    assert comment.id == cancelled.json()["pr_comment"]
    assert "left open for a person to decide" in comment.body
    assert query(upgraded, "select state from tasks") == [("cancelled",)]
    refused = cli("--json", "review", "--task", str(task))
    assert refused.exit_code == 1
    assert "cancelled, not awaiting_review" in refused.json()["error"]["message"]


def hung_step(step: str, task: int, failpoint: str):
    """STEP for TASK as a separate process, hanging at FAILPOINT (a forge reply slow to
    come back: its request reached the forge)."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "aiworker", step, "--task", str(task)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "AIWORKER_FAILPOINT": f"{failpoint}:hang"},
    )


def until(check, what: str, timeout: float = 120):
    import time

    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return found


def test_a_cancel_that_meets_a_publish_in_flight_finds_its_pr_and_comments_on_it(
    forge, delivered, upgraded, cli
):
    """The publish opened the PR on the forge but had not recorded it when the cancel
    stopped it: the cancel finds the PR by the publication's marker, records it and
    leaves it open with the comment."""
    task, _head = delivered()
    worker = forge.client("worker-bot")
    step = hung_step("publish", task, "publish.after_request")
    try:
        [pull] = until(lambda: worker.pulls("team", "app"), "the PR to be opened")
        cancelled = cli("--json", "task", "cancel", str(task))
    finally:
        step.kill()
        step.wait()
    assert cancelled.exit_code == 0, cancelled
    report = cancelled.json()
    assert (report["was"], report["pr_merged"]) == ("implemented", None)
    [comment] = worker.comments("team", "app", pull.number)
    assert comment.id == report["pr_comment"]
    assert "left open for a person to decide" in comment.body
    assert query(upgraded, "select state, pr_number from publications") == [("opened", pull.number)]


def test_a_cancel_that_meets_a_merge_in_flight_records_the_merge_it_could_not_stop(
    forge, delivered, upgraded, cli
):
    """The merge request reached the forge before the cancel: the PR is merged, so the
    cancel says so, records the publication as merged and posts no "left open" comment."""
    task, head = delivered()
    reports = deliver_until(task, "publish", "ci", "review", cli=cli)
    assert [r.exit_code for r in reports.values()] == [0, 0, 0], reports
    pr = reports["publish"].json()["pr"]
    worker = forge.client("worker-bot")
    step = hung_step("merge", task, "merge.after_request")
    try:
        until(lambda: worker.pull("team", "app", pr).merged, "the merge")
        cancelled = cli("task", "cancel", str(task))
    finally:
        step.kill()
        step.wait()
    assert cancelled.exit_code == 0, cancelled
    assert f"PR #{pr} had merged before the cancel took effect" in cancelled.stdout
    assert [c for c in worker.comments("team", "app", pr) if c.user.login == "worker-bot"] == []
    assert query(upgraded, "select state, head_commit from publications") == [("merged", head)]
    shown = cli("--json", "task", "show", str(task)).json()
    assert shown["state"] == "cancelled"
    [merged] = [e for e in shown["history"] if e["kind"] == "pr.merged_before_cancel"]
    assert merged["data"]["merge_commit"] == worker.pull("team", "app", pr).merge_commit_sha


def test_a_cancel_while_the_forge_stalls_tries_its_pr_comment_once(forge, delivered, upgraded, cli):
    """The cancel's comment on the PR is a courtesy: a forge that takes connections and
    answers none costs it one try (one forge timeout), not five tries and their back-off
    (three minutes an operator, or the page, waited on). The task is cancelled all the
    same, and the failed comment is recorded."""
    import socket
    import threading

    task, _head = delivered()
    assert deliver_until(task, "publish", cli=cli)["publish"].exit_code == 0
    stalled = socket.create_server(("127.0.0.1", 0))
    taken: list[socket.socket] = []

    def take() -> None:
        while True:
            try:
                taken.append(stalled.accept()[0])  # held open, never answered
            except OSError:
                return

    threading.Thread(target=take, daemon=True).start()
    config = Path(os.environ["AIWORKER_CONFIG"])
    url = f"http://127.0.0.1:{stalled.getsockname()[1]}"
    config.write_text(
        config.read_text().replace(f'url = "{forge.url}"', f'url = "{url}"\ntimeout_seconds = 1')
    )
    try:
        cancelled = cli("--json", "task", "cancel", str(task))
    finally:
        stalled.close()
        for connection in taken:
            connection.close()
    assert cancelled.exit_code == 0, cancelled
    assert cancelled.json()["pr_comment"] is None
    assert len(taken) == 1
    assert query(upgraded, "select state from tasks") == [("cancelled",)]
    [(reason,)] = query(upgraded, "select data from events where kind = 'pr.comment_failed'")
    assert "no answer within 1 s" in reason


def test_a_base_that_moved_after_implementation_still_ends_in_a_merged_pr(
    forge, delivered, upgraded, cli, tmp_path
):
    task, head = delivered()
    work = tmp_path / "alice"
    git("clone", "-q", forge.clone_url("alice"), str(work))
    (work / "README.md").write_text("main moved on\n")
    git("commit", "-qam", "Move main", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    reports = deliver_until(task, "publish", "ci", "review", "merge", cli=cli)
    for step, result in reports.items():
        assert result.exit_code == 0, (step, result)
    refreshed = reports["publish"].json()["head"]
    assert refreshed != head
    worker = forge.client("worker-bot")
    assert worker.combined_status("team", "app", refreshed).state == "success"
    [approved] = worker.reviews("team", "app", reports["publish"].json()["pr"])
    assert approved.commit_id == refreshed
    bare = forge.data / "git" / "team" / "app.git"
    assert "a + b" in git("--git-dir", str(bare), "show", "main:calc.py").stdout
    assert git("--git-dir", str(bare), "show", "main:README.md").stdout == "main moved on\n"
    assert query(upgraded, "select phase, outcome from receipts order by id") == [
        ("validation", "pass"),
        ("validation", "pass"),
        ("ci", "pass"),
        ("merge", "merged"),
    ]


@pytest.mark.parametrize("polled_first", [True, False], ids=["poll-recorded", "unpolled"])
def test_an_issue_edited_after_approval_goes_to_repair_not_to_merge(
    forge, delivered, upgraded, polled_first
):
    task, head = delivered()
    reports = deliver_until(task, "publish", "ci", "review")
    assert all(r.exit_code == 0 for r in reports.values()), reports
    pr = reports["publish"].json()["pr"]
    edit_issue(forge, 1, body="add() must also accept three numbers")
    if polled_first:  # the poll records the new scope on the approved task
        assert run_process("poll").exit_code == 0
        assert query(upgraded, "select state from tasks") == [("approved",)]
    merged = run_process("--json", "merge", "--task", str(task))
    assert merged.exit_code == 0, merged
    assert (merged.json()["merge_commit"], merged.json()["state"]) == (None, "repairing")
    assert forge.client("worker-bot").is_merged("team", "app", pr) is False
    assert query(upgraded, "select state from tasks") == [("repairing",)]
    [(data,)] = query(
        upgraded, "select data from events where kind = 'repair.requested' order by id desc"
    )[:1]
    assert '"cause": "scope"' in data
    assert f'"start": "{head}"' in data
    human = run_process("merge", "--task", str(task))
    assert human.exit_code != 0  # repairing now: nothing to merge


def test_an_issue_edited_after_implementation_is_repaired_before_it_is_published(
    forge, delivered, upgraded
):
    task, _head = delivered()
    edit_issue(forge, 1, body="add() must also accept three numbers")
    assert run_process("poll").exit_code == 0
    published = run_process("--json", "publish", "--task", str(task))
    assert published.exit_code == 0, published
    assert (published.json()["pr"], published.json()["state"]) == (None, "repairing")
    assert forge.client("worker-bot").pulls("team", "app", state="all") == []
    assert query(upgraded, "select state from tasks") == [("repairing",)]


PUBLIC = "https://aiworker.example.org"


def test_the_ci_status_links_its_receipt_page_and_is_posted_by_the_ci_identity(
    forge, delivered, upgraded, cli, monkeypatch
):
    task, head = delivered()
    config = Path(os.environ["AIWORKER_CONFIG"])
    monkeypatch.setenv("AIWORKER_TEST_CI_TOKEN", forge.tokens["ci-bot"])
    ci_identity = '[forge.identities.ci]\ntoken_env = "AIWORKER_TEST_CI_TOKEN"\n'
    config.write_text(config.read_text() + ci_identity + f'[web]\npublic_url = "{PUBLIC}/"\n')
    reports = deliver_until(task, "publish", "ci", "review", "merge", cli=cli)
    for step, result in reports.items():
        assert result.exit_code == 0, (step, result)  # merge: the ci identity's word counts
    ci = reports["ci"].json()
    posted = forge.app.state.repo("team", "app")["statuses"][head]
    assert [(s["state"], s["creator"]) for s in posted] == [
        ("pending", "ci-bot"),
        ("success", "ci-bot"),
    ]
    link = f"{PUBLIC}/receipts/{ci['receipt']}"
    assert (posted[-1]["target_url"], ci["receipt_url"]) == (link, link)
    with serving() as url:
        # As the reverse proxy forwards it: the public name in Host.
        proxied = {"Host": "aiworker.example.org"}
        page = requests.get(f"{url}/receipts/{ci['receipt']}", headers=proxied, timeout=10)
        assert page.status_code == 200, page.text
        assert page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        text = page.text
        for shown in (head, ci["check"]["stdout_sha256"], ci["check"]["stderr_sha256"], "./ci/run"):
            assert shown in text, shown
        last_line = ci["check"]["stderr_tail"].strip().splitlines()[-1]
        assert html.escape(last_line) in text
        document = requests.get(f"{url}/api/v1/receipts/{ci['receipt']}", timeout=10).json()
        assert (document["task"], document["head"], document["outcome"]) == (task, head, "pass")
        assert document["body"]["stdout_sha256"] == ci["check"]["stdout_sha256"]
        # The artifacts the page names open, verified, as the bytes they are.
        kept = {a["name"]: a for a in document["artifacts"]}
        # Short streams: their tails hold them whole, so the runner sent no log.
        assert set(kept) == {"stdout.tail", "stderr.tail", "receipt.json"}
        assert kept["receipt.json"]["sha256"] == ci["check"]["receipt_sha256"]
        for artifact in kept.values():
            assert f"/artifacts/{artifact['sha256']}" in text
            served = requests.get(f"{url}/artifacts/{artifact['sha256']}", timeout=10)
            assert served.status_code == 200, served.text
            assert hashlib.sha256(served.content).hexdigest() == artifact["sha256"]
            assert len(served.content) == artifact["size"]
            assert served.headers["x-content-type-options"] == "nosniff"
        receipt = requests.get(f"{url}/artifacts/{kept['receipt.json']['sha256']}", timeout=10)
        assert receipt.json()["exit_code"] == 0
        assert receipt.json()["artifacts"]["stderr.tail"] == kept["stderr.tail"]["sha256"]
        assert ci["check"]["stderr_tail"] in (
            requests.get(f"{url}/artifacts/{kept['stderr.tail']['sha256']}", timeout=10).text
        )
        unknown = requests.get(f"{url}/artifacts/{'0' * 64}", timeout=10)
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "not_found")
        assert requests.get(f"{url}/artifacts/..%2f..%2fetc", timeout=10).status_code in (404, 422)
        missing = requests.get(f"{url}/receipts/{ci['receipt'] + 1000}", timeout=10)
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
        forged = requests.get(
            f"{url}/receipts/{ci['receipt']}", headers={"Host": "elsewhere.example.org"}, timeout=10
        )
        assert forged.status_code == 421


def test_a_public_url_that_is_not_an_origin_is_named(forge, tmp_path, monkeypatch):
    config = configure(tmp_path, forge, monkeypatch)
    config.write_text(config.read_text() + '[web]\npublic_url = "https://proxy.example.org/x?y"\n')
    refused = run_process("--json", "config", "validate")
    assert refused.exit_code == 2
    assert "web.public_url" in refused.stdout + refused.stderr
    # Kept as a browser names it in Host (the link must pass the Host check).
    text = config.read_text().replace(
        "https://proxy.example.org/x?y", "https://Proxy.Example.ORG:443/"
    )
    config.write_text(text)
    shown = run_process("--json", "config", "show").json()
    assert shown["config"]["web"]["public_url"] == "https://proxy.example.org"


def test_a_ci_status_posted_by_someone_else_does_not_let_the_pr_merge(forge, delivered, upgraded):
    task, head = delivered()
    reports = deliver_until(task, "publish", "ci", "review")
    assert [r.exit_code for r in reports.values()] == [0, 0, 0], reports
    # A writer posts in aiworker's context after it: the newest word there is not ours.
    forge.client("alice").create_status(
        "team", "app", head, state="success", context="aiworker / ci", description="trust me"
    )
    refused = run_process("--json", "merge", "--task", str(task))
    assert refused.exit_code == 1
    message = refused.json()["error"]["message"]
    assert "no successful 'aiworker / ci' status by worker-bot on" in message
    assert run_process("--json", "task", "show", str(task)).json()["state"] == "approved"


def test_a_ci_run_that_cannot_finish_shows_the_forge_no_controller_path(
    forge, delivered, upgraded, state_dir
):
    """The terminal `error` status says why the run could not finish without spelling out
    where the controller keeps its files (here a state directory with a file where its
    snapshots' folder belongs); a review whose finding names its workspace's host path
    (bubblewrap binds it there) is posted with it named, not spelled out."""
    where = f"{state_dir}/workspaces/task-1-review-3/repo/calc.py"
    finding = {"severity": "info", "message": f"See {where}.", "path": where}
    review = {"result": {**REVIEW_OK["result"], "findings": [finding]}}
    task, head = delivered(review=review)
    assert run_process("publish", "--task", str(task)).exit_code == 0
    shutil.rmtree(state_dir / "snapshots", ignore_errors=True)
    (state_dir / "snapshots").write_text("not a folder\n")
    failed = run_process("--json", "ci", "--task", str(task))
    assert failed.exit_code == 2, failed  # the operator's to mend
    message = failed.json()["error"]["message"]  # the operator is told where
    assert message.endswith("Not a directory; a part of it is a file, not a directory")
    assert str(state_dir) in message
    [status] = forge.client("worker-bot").combined_status("team", "app", head).statuses
    assert status.status == "error"
    assert status.description.startswith("aiworker could not finish ./ci/run: "), status
    assert "<state directory>/snapshots" in status.description, status.description
    assert str(state_dir.resolve()) not in status.description
    # CI passes once the snapshots' folder is back; the review follows.
    (state_dir / "snapshots").unlink()
    assert run_process("ci", "--task", str(task)).exit_code == 0
    assert run_process("review", "--task", str(task)).exit_code == 0
    pr = forge.client("worker-bot").pulls("team", "app", state="all")[0].number
    [posted] = forge.client("worker-bot").reviews("team", "app", pr)
    assert "See <state directory>/workspaces/task-1-review-3/repo/calc.py." in posted.body
    assert str(state_dir) not in posted.body
