"""A person acts on the forge against a task's work: closes its pull request or its
issue, or points the pull request at another branch. Trying again cannot mend that, so
the step that meets it holds the task (paused, with the reason) instead of retrying until
its budget is spent, and never merges or opens a new pull request over the person."""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import UTC, datetime, timedelta

import pytest

from aiworker.core.delivery import publish as publish_module
from tests.forge_fixtures import git
from tests.helpers import run_process
from tests.test_delivery import REVIEW_BLOCKING, deliver_until, delivered  # noqa: F401 - fixture
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc
from tests.test_lifecycle import edit_issue
from tests.test_repair import MORE_TESTS, repair_once


def _held(database, task: int) -> str:
    """The task is paused, its claim gone, every attempt closed and the last one refunded;
    the reason it was held."""
    assert query(database, "select state, claim_slot from tasks") == [("paused", None)]
    assert query(database, "select count(*) from attempts where finished_at is null") == [(0,)]
    [(outcome, refunded)] = query(
        database, "select outcome, refunded from attempts order by id desc limit 1"
    )
    assert (outcome, refunded) == ("unavailable", 1)
    [(data,)] = query(
        database, "select data from events where kind = 'task.held' order by id desc limit 1"
    )
    reason = json.loads(data)["reason"]
    assert f"held until an operator fixes it and runs `aiworker task resume {task}`" in reason
    return reason


def _patch_pull(forge, number: int, **fields) -> None:
    forge.as_user("alice", "PATCH", f"/pulls/{number}", fields)


def test_a_pull_request_a_person_closed_holds_the_task(
    forge,
    delivered,  # noqa: F811
    upgraded,
):
    task, _head = delivered()
    published = deliver_until(task, "publish")["publish"]
    pr = published.json()["pr"]
    _patch_pull(forge, pr, state="closed")
    ci = run_process("--json", "ci", "--task", str(task))
    assert ci.exit_code == 1, ci
    reason = _held(upgraded, task)
    assert f"PR #{pr} was closed on the forge without being merged" in reason
    # status names what waits for the operator, and why.
    [held] = run_process("--json", "status").json()["held"]
    assert (held["task"], held["reason"]) == (task, reason)
    shown = " ".join(run_process("status").stdout.split())
    assert f"Held for you: task {task} since" in shown
    assert f"runs `aiworker task resume {task}`" in shown
    # Held, not retried: another tick finds nothing to run for it, and no second PR.
    assert run_process("--json", "ci", "--task", str(task)).exit_code == 1
    assert query(upgraded, "select count(*) from attempts where phase = 'ci'") == [(1,)]
    pulls = forge.client("worker-bot").pulls("team", "app", state="all")
    assert [p.number for p in pulls] == [pr]


@pytest.mark.parametrize("recorded_before", [False, True])
def test_a_task_the_operator_resumed_stays_resumed_at_the_next_polls(
    forge,
    delivered,  # noqa: F811
    upgraded,
    recorded_before,
):
    """`task resume` is the operator's word, not an authorisation on the forge: the polls
    after it judge the task by the writer who assigned its issue, and leave it resumed
    (also where the resume was recorded as aiworker recorded it before 2026-12)."""
    task, _head = delivered()
    pr = deliver_until(task, "publish")["publish"].json()["pr"]
    _patch_pull(forge, pr, state="closed")
    assert run_process("--json", "ci", "--task", str(task)).exit_code == 1
    _held(upgraded, task)
    # Issue 1 changes no more: once another issue is newer, a poll judges its task by who
    # authorised it (their permission now), not from its timeline.
    time.sleep(1.1)
    edit_issue(forge, 2, title="Something else")
    assert run_process("--json", "poll").json()["polls"] == {"incremental": 1}
    _patch_pull(forge, pr, state="open")
    assert run_process("--json", "task", "resume", str(task)).json()["state"] == "awaiting_ci"
    if recorded_before:
        with sqlite3.connect(upgraded) as conn:
            conn.execute("update events set kind = 'task.resumed' where actor = 'operator'")
    for _ in range(2):
        polled = run_process("--json", "poll").json()
        assert (polled["polls"], polled["paused"]) == ({"incremental": 1}, []), polled
    assert query(upgraded, "select state from tasks") == [("awaiting_ci",)]
    assert run_process("--json", "ci", "--task", str(task)).exit_code == 0


def test_an_issue_closed_before_the_merge_holds_the_task_unmerged(
    forge,
    delivered,  # noqa: F811
    upgraded,
):
    task, _head = delivered()
    reports = deliver_until(task, "publish", "ci", "review")
    assert all(r.exit_code == 0 for r in reports.values()), reports
    edit_issue(forge, 1, state="closed")
    merged = run_process("--json", "merge", "--task", str(task))
    assert merged.exit_code == 1, merged
    assert "issue #1 was closed on the forge" in _held(upgraded, task)
    pr = reports["publish"].json()["pr"]
    assert forge.client("worker-bot").is_merged("team", "app", pr) is False


def test_an_issue_unassigned_before_the_merge_pauses_the_task_until_assigned_again(
    forge,
    delivered,  # noqa: F811
    upgraded,
):
    """The issue's author (a writer) takes the assignment back after the review approved the
    work: the request no longer stands, so nothing is merged; the task waits, paused, and
    goes on once a writer assigns the issue again."""
    task, _head = delivered()
    reports = deliver_until(task, "publish", "ci", "review")
    assert all(r.exit_code == 0 for r in reports.values()), reports
    pr = reports["publish"].json()["pr"]
    edit_issue(forge, 1, assignees=[])
    assert run_process("--json", "merge", "--task", str(task)).exit_code == 0
    assert forge.client("worker-bot").is_merged("team", "app", pr) is False
    assert query(upgraded, "select state from tasks") == [("paused",)]
    assert query(upgraded, "select count(*) from attempts where finished_at is null") == [(0,)]
    [(data,)] = query(
        upgraded, "select data from events where kind = 'task.paused' order by id desc limit 1"
    )
    assert json.loads(data)["reason"] == (
        "authorisation no longer holds: the issue is no longer assigned to worker-bot"
    )
    # Not held for the operator: the poll leaves it paused while nobody asks, and takes
    # it back to its merge once a writer assigns the issue again.
    assert run_process("--json", "poll").exit_code == 0
    assert query(upgraded, "select state from tasks") == [("paused",)]
    edit_issue(forge, 1, assignees=["worker-bot"])
    assert run_process("--json", "poll").json()["tasks"] == {"resumed": 1}
    assert query(upgraded, "select state from tasks") == [("approved",)]
    merged = run_process("--json", "merge", "--task", str(task))
    assert merged.exit_code == 0, merged
    assert forge.client("worker-bot").is_merged("team", "app", pr) is True
    assert query(upgraded, "select state from tasks") == [("done",)]


def test_an_assignment_taken_back_before_publication_pauses_the_task_unpublished(
    forge,
    delivered,  # noqa: F811
    upgraded,
):
    """Publish re-reads the issue: work no longer asked for is not pushed or proposed; the
    task pauses (before the poll got to it) as the poll would pause it."""
    task, _head = delivered()
    edit_issue(forge, 1, assignees=[])
    assert run_process("--json", "publish", "--task", str(task)).exit_code == 0
    assert query(upgraded, "select state from tasks") == [("paused",)]
    assert forge.client("worker-bot").pulls("team", "app", state="all") == []
    [(outcome, reason)] = query(
        upgraded, "select outcome, reason from attempts where phase = 'publish'"
    )
    assert outcome == "succeeded"
    assert reason == (
        "not published: authorisation no longer holds: the issue is no longer assigned to "
        "worker-bot"
    )


def test_a_pull_request_pointed_elsewhere_is_not_merged_there(
    forge,
    delivered,  # noqa: F811
    upgraded,
    tmp_path,
):
    task, _head = delivered()
    reports = deliver_until(task, "publish", "ci", "review")
    assert all(r.exit_code == 0 for r in reports.values()), reports
    work = tmp_path / "release"
    git("clone", "-q", forge.clone_url("alice"), str(work))
    git("push", "-q", "origin", "HEAD:refs/heads/release", cwd=work)
    pr = reports["publish"].json()["pr"]
    _patch_pull(forge, pr, base="release")
    merged = run_process("--json", "merge", "--task", str(task))
    assert merged.exit_code == 1, merged
    reason = _held(upgraded, task)
    assert f"PR #{pr} now targets release, not main" in reason
    assert forge.client("worker-bot").is_merged("team", "app", pr) is False


def _sent_to_repair(claimed) -> tuple[int, dict]:
    """A task implemented, published, checked and sent to a repair by its review; its id
    and the steps' reports."""
    task = claimed(
        SCRIPT_ONLY,
        edits={"calc.py": FIX},
        result=result_doc(),
        phases={
            "review": REVIEW_BLOCKING,
            "repair": {"edits": {"test_calc.py": MORE_TESTS}, "result": result_doc()},
        },
    )
    implemented = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert implemented.exit_code == 0, implemented
    reports = deliver_until(task, "publish", "ci", "review")
    assert reports["review"].json()["state"] == "repairing"
    return task, reports


def test_a_pull_request_closed_during_a_repair_is_not_replaced(forge, claimed, upgraded, cli):
    task, reports = _sent_to_repair(claimed)
    pr = reports["publish"].json()["pr"]
    branch_before = forge.client("alice").branch("team", "app", f"aiworker/task-{task}")
    _patch_pull(forge, pr, state="closed")  # the person rejects the work
    assert repair_once(cli, task).exit_code == 1  # held before any inference is spent
    assert f"PR #{pr} was closed on the forge without being merged" in _held(upgraded, task)
    # Resumed without reopening it, the next episode holds it again, and no provider ran.
    assert run_process("task", "resume", str(task)).exit_code == 0
    assert repair_once(cli, task).exit_code == 1
    _held(upgraded, task)
    tries = query(upgraded, "select provider, outcome from attempts where phase = 'repair'")
    assert tries == [(None, "unavailable")] * 2
    # Before: a new PR was opened over the closed one, and went on to be merged.
    pulls = forge.client("worker-bot").pulls("team", "app", state="all")
    assert [(p.number, p.state) for p in pulls] == [(pr, "closed")]
    branch_after = forge.client("alice").branch("team", "app", f"aiworker/task-{task}")
    assert branch_after.commit.id == branch_before.commit.id  # nothing pushed over it


def test_a_commit_a_person_pushed_to_the_branch_is_not_pushed_over(
    forge, claimed, upgraded, cli, tmp_path
):
    task, _ = _sent_to_repair(claimed)
    branch = f"aiworker/task-{task}"
    work = tmp_path / "alice"
    git("clone", "-q", "-b", branch, forge.clone_url("alice"), str(work))
    (work / "NOTES.md").write_text("What the review missed.\n")
    git("add", "NOTES.md", cwd=work)
    git("commit", "-qm", "A person's own commit", cwd=work)
    git("push", "-q", "origin", branch, cwd=work)
    theirs = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    assert repair_once(cli, task).exit_code == 0
    published = run_process("--json", "publish", "--task", str(task))
    assert published.exit_code == 1, published
    reason = _held(upgraded, task)
    assert f"{branch} on the forge is at {theirs[:12]}, which this task did not push" in reason
    # Before: the repair's head was force-pushed over it, and the commit was gone.
    assert forge.client("alice").branch("team", "app", branch).commit.id == theirs


def test_a_base_branch_rewritten_under_the_work_is_not_merged_into(
    forge, claimed, upgraded, tmp_path
):
    """The owner force-pushes main to remove a commit (a secret) that the work was built
    on: merging would bring it back."""
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    work = tmp_path / "owner"
    git("clone", "-q", forge.clone_url("alice"), str(work))
    (work / "SECRET.txt").write_text("a token pushed by mistake\n")
    git("add", "SECRET.txt", cwd=work)
    git("commit", "-qm", "Oops", cwd=work)
    git("push", "-q", "origin", "HEAD:main", cwd=work)
    implemented = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert implemented.exit_code == 0, implemented
    reports = deliver_until(task, "publish", "ci", "review")
    assert all(r.exit_code == 0 for r in reports.values()), reports
    git("push", "-q", "--force", "origin", "HEAD~1:main", cwd=work)
    merged = run_process("--json", "merge", "--task", str(task))
    assert merged.exit_code == 1, merged
    assert "main was rewritten: it no longer holds" in _held(upgraded, task)
    pr = reports["publish"].json()["pr"]
    assert forge.client("worker-bot").is_merged("team", "app", pr) is False
    bare = forge.data / "git" / "team" / "app.git"
    shown = git("--git-dir", str(bare), "ls-tree", "--name-only", "main", check=False)
    assert "SECRET.txt" not in shown.stdout
    # What it was built on is gone: it starts over, on the base as it is now.
    again = run_process("--json", "task", "retry", "--from-start", str(task))
    assert again.exit_code == 0, again
    assert query(upgraded, "select state from tasks") == [("ready",)]


def _merged_by_person(upgraded, task: int, pr: int) -> dict:
    """The task is done, its claim gone and every attempt closed, with the merge a person
    made on the forge recorded as its evidence; that evidence."""
    assert query(upgraded, "select state, claim_slot from tasks") == [("done", None)]
    assert query(upgraded, "select count(*) from attempts where finished_at is null") == [(0,)]
    [(body,)] = query(upgraded, "select body from receipts where outcome = 'merged'")
    evidence = json.loads(body)
    assert (evidence["pr"], evidence["merged_by"], evidence["by_aiworker"]) == (pr, "alice", False)
    return evidence


def test_a_pull_request_a_person_merged_ends_the_task_without_more_checks(
    forge,
    delivered,  # noqa: F811
    upgraded,
):
    task, head = delivered()
    pr = deliver_until(task, "publish")["publish"].json()["pr"]
    forge.client("alice").merge_pull("team", "app", pr, style="merge")
    # The merge closed the issue the PR resolves, as Forgejo does; before, the next poll
    # paused the task for a closed issue, and it waited for an operator.
    assert forge.client("alice").issue("team", "app", 1).state == "closed"
    assert run_process("--json", "poll").exit_code == 0
    assert query(upgraded, "select state from tasks") == [("awaiting_ci",)]
    jobs = query(upgraded, "select count(*) from worker_jobs")
    ci = run_process("--json", "ci", "--task", str(task))
    assert ci.exit_code == 0, ci
    evidence = _merged_by_person(upgraded, task, pr)
    merge_commit = forge.client("alice").pull("team", "app", pr).merge_commit_sha
    assert (evidence["head"], evidence["merge_commit"]) == (head, merge_commit)
    # Before: CI ran on the merged head and a review spent inference on it.
    assert query(upgraded, "select count(*) from worker_jobs") == jobs
    assert run_process("--json", "review", "--task", str(task)).exit_code == 1
    phases = query(upgraded, "select phase from attempts order by id")
    assert phases == [("implementation",), ("publish",), ("ci",)]


def test_a_pull_request_merged_during_a_repair_spends_no_repair(forge, claimed, upgraded, cli):
    task, reports = _sent_to_repair(claimed)
    pr = reports["publish"].json()["pr"]
    forge.client("alice").merge_pull("team", "app", pr, style="merge")  # good enough for them
    assert repair_once(cli, task).exit_code == 0
    _merged_by_person(upgraded, task, pr)
    assert query(upgraded, "select count(*) from attempts where phase = 'repair'") == [(0,)]


def test_a_pull_request_merged_before_its_repair_is_published_is_not_pushed_to(
    forge, claimed, upgraded, cli
):
    task, reports = _sent_to_repair(claimed)
    pr = reports["publish"].json()["pr"]
    assert repair_once(cli, task).exit_code == 0
    forge.client("alice").merge_pull("team", "app", pr, style="merge")
    merged_head = forge.client("alice").pull("team", "app", pr).head.sha
    published = run_process("--json", "publish", "--task", str(task))
    assert published.exit_code == 0, published
    assert published.json()["merged_by"] == "alice"
    evidence = _merged_by_person(upgraded, task, pr)
    assert evidence["head"] == merged_head
    branch = forge.client("alice").branch("team", "app", f"aiworker/task-{task}")
    assert branch.commit.id == merged_head  # the repair's head was not pushed after it


def test_a_merge_a_person_made_into_another_branch_delivers_nothing(
    forge,
    delivered,  # noqa: F811
    upgraded,
    tmp_path,
):
    task, _head = delivered()
    pr = deliver_until(task, "publish")["publish"].json()["pr"]
    work = tmp_path / "release"
    git("clone", "-q", forge.clone_url("alice"), str(work))
    git("push", "-q", "origin", "HEAD:refs/heads/release", cwd=work)
    _patch_pull(forge, pr, base="release")
    forge.client("alice").merge_pull("team", "app", pr, style="merge")
    ci = run_process("--json", "ci", "--task", str(task))
    assert ci.exit_code == 1, ci
    assert f"PR #{pr} was merged on the forge into release, not main" in _held(upgraded, task)
    assert query(upgraded, "select count(*) from receipts where outcome = 'merged'") == [(0,)]


def test_a_merge_while_publish_checks_its_preconditions_is_not_pushed_over(
    forge, claimed, upgraded, cli, monkeypatch
):
    """Publish checks authorisation, scope and the base (a refreshed base runs the checks
    again: minutes) before it pushes; a person merges the PR meanwhile."""
    task, reports = _sent_to_repair(claimed)
    pr = reports["publish"].json()["pr"]
    assert repair_once(cli, task).exit_code == 0
    checking = publish_module._preconditions

    def merged_meanwhile(*args, **kwargs):
        forge.client("alice").merge_pull("team", "app", pr, style="merge")
        return checking(*args, **kwargs)

    monkeypatch.setattr(publish_module, "_preconditions", merged_meanwhile)
    published = cli("--json", "publish", "--task", str(task))
    assert published.exit_code == 0, published
    # Before, the repair's head was pushed and a second PR opened, which went on to CI.
    pulls = forge.client("alice").pulls("team", "app", state="all")
    assert [(p.number, p.merged) for p in pulls] == [(pr, True)]
    _merged_by_person(upgraded, task, pr)


def test_a_poll_asks_about_a_pull_request_only_for_a_task_it_would_pause(
    forge,
    delivered,  # noqa: F811
    upgraded,
):
    task, _head = delivered()
    pr = deliver_until(task, "publish")["publish"].json()["pr"]
    read = f"GET /repos/team/app/pulls/{pr}"
    before = forge.app.api_calls[read]
    # Minutes later nothing changed: an incremental poll lists no issue. The task's issue
    # still asks for the work, and its PR is none of the poll's business.
    later = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    with sqlite3.connect(upgraded) as db:
        db.execute("update repositories set settings = json_set(settings, '$.poll.since', ?)",
                   (later,))  # fmt: skip
    db.close()
    for _ in range(2):
        assert run_process("--json", "poll").json()["polls"] == {"incremental": 1}
    assert forge.app.api_calls[read] == before
    # A PR that cannot be read (a person deleted it) does not stop the poll: the task
    # whose issue closed is paused, as before.
    with sqlite3.connect(upgraded) as db:
        db.execute("update publications set pr_number = 999")
    db.close()
    edit_issue(forge, 1, state="closed")
    assert run_process("--json", "poll", "--full").exit_code == 0
    assert query(upgraded, "select state from tasks") == [("paused",)]


def test_a_store_started_over_does_not_open_a_second_pull_request_for_an_issue(
    forge,
    delivered,  # noqa: F811
    upgraded,
    state_dir,
):
    """The database is lost and started over (`db upgrade` on an empty one, not a restore):
    the issue whose pull request is open becomes a task again, under the same id, whose
    work is not published beside the open pull request nor pushed over its branch; the
    task is held, saying which pull request and why."""
    task, _head = delivered()
    pr = deliver_until(task, "publish")["publish"].json()["pr"]
    for path in state_dir.glob("aiworker.db*"):
        path.unlink()
    assert run_process("db", "upgrade").exit_code == 0
    assert run_process("--json", "poll").json()["tasks"] == {"created": 1}
    assert run_process("--json", "claim", "--slot", "1").json()["task"] == task
    assert run_process("--json", "implement", "--task", str(task), "--slot", "1").exit_code == 0
    published = run_process("--json", "publish", "--task", str(task))
    assert published.exit_code == 1, published
    reason = _held(upgraded, task)
    assert reason.startswith(
        f"PR #{pr} is open for issue #1, opened by aiworker for a task this database does "
        f"not hold (restored from before it, or started over): close PR #{pr} to publish "
        f"this work instead, or cancel task {task}"
    )
    pulls = forge.client("worker-bot").pulls("team", "app", state="all")
    assert [p.number for p in pulls] == [pr]


def test_another_kind_of_task_on_an_issue_does_not_open_a_second_pull_request(
    forge,
    delivered,  # noqa: F811
    upgraded,
):
    """A writer labels an issue whose pull request is open as a feature: the poll pauses the
    first task and records a feature task, whose work is held at publish, naming the
    first task and its pull request."""
    task, _head = delivered()
    pr = deliver_until(task, "publish")["publish"].json()["pr"]
    alice = forge.client("alice")
    alice.create_label("team", "app", "aiworker-feature", "#0e8a16")
    alice.add_labels("team", "app", 1, ["aiworker-feature"])
    assert run_process("--json", "poll").json()["tasks"]["created"] == 1
    [(feature,)] = query(upgraded, "select id from tasks where kind = 'feature'")
    assert run_process("--json", "claim", "--slot", "1").json()["task"] == feature
    implemented = run_process("--json", "implement", "--task", str(feature), "--slot", "1")
    assert implemented.exit_code == 0, implemented
    assert run_process("--json", "publish", "--task", str(feature)).exit_code == 1
    [(data,)] = query(upgraded, "select data from events where kind = 'task.held'")
    assert json.loads(data)["reason"].startswith(
        f"PR #{pr} is open for issue #1, opened by aiworker for task {task}, which is paused: "
        f"close PR #{pr} to publish this work instead, or cancel task {feature}"
    )
    pulls = forge.client("worker-bot").pulls("team", "app", state="all")
    assert [p.number for p in pulls] == [pr]
