"""Authorisation judged at every poll: a permission change on the forge moves no issue, yet
the task it authorised pauses at the next incremental poll; who made a change counts,
whatever the second it was made in."""

from __future__ import annotations

import sqlite3

import pytest
import requests

from tests.helpers import configure, run_process


@pytest.fixture
def polled(forge, upgraded, tmp_path, monkeypatch):
    configure(tmp_path, forge, monkeypatch)
    return upgraded


def poll(*args):
    result = run_process("--json", "poll", *args)
    assert result.exit_code == 0, result
    return result.json()


def states(db_path) -> dict[int, str]:
    conn = sqlite3.connect(db_path)
    rows = conn.execute("select issue_number, state from tasks").fetchall()
    conn.close()
    return dict(rows)


def grant(forge, login, permission):
    forge.client("team").add_collaborator("team", "app", login, permission)


def as_user(forge, login, method, path, body=None):
    response = requests.request(
        method,
        f"{forge.url}/api/v1/repos/team/app{path}",
        json=body,
        headers={"Authorization": f"token {forge.tokens[login]}"},
        timeout=10,
    )
    assert response.status_code < 300, response.text


def test_a_demoted_assigner_and_labeller_pause_their_tasks_at_the_next_incremental_poll(
    forge, polled
):
    forge.client("alice").add_labels("team", "app", 2, ["aiworker-plan"])
    assert poll()["tasks"] == {"created": 2}  # issue 1 was assigned by alice
    forge.app.api_calls.clear()
    grant(forge, "alice", "read")
    report = poll()
    assert report["polls"] == {"incremental": 1}
    # Issue 2, changed within the cursor's second, is judged from its timeline; issue 1 by
    # the permission now of alice, who assigned it.
    reasons = {p["issue"]: p["reason"] for p in report["paused"]}
    assert reasons[2] == "labelled aiworker-plan by alice, who has only read permission"
    assert reasons[1] in (
        "authorised by alice, who now has only read permission",
        "assigned to worker-bot by alice, who has only read permission",  # the same second
    )
    assert states(polled) == {1: "paused", 2: "paused"}
    # One permission read per (repository, login) in the poll, for both tasks.
    reads = {c: n for c, n in forge.app.api_calls.items() if c.endswith("/permission")}
    assert reads == {"GET /repos/team/app/collaborators/alice/permission": 1}
    # A writer authorising the work again resumes it: the owner assigns the issue anew.
    as_user(forge, "team", "PATCH", "/issues/1", {"assignees": []})
    as_user(forge, "team", "PATCH", "/issues/1", {"assignees": ["worker-bot"]})
    assert poll()["tasks"]["resumed"] == 1
    assert states(polled) == {1: "ready", 2: "paused"}


def test_a_removed_collaborator_pauses_their_task(forge, polled):
    poll()
    as_user(forge, "team", "DELETE", "/collaborators/alice")
    [paused] = poll()["paused"]
    # Removed from a public repository, alice can still read it: no more than that.
    assert paused["issue"] == 1
    assert "by alice, who has only read permission" in paused["reason"]
    assert states(polled) == {1: "paused"}


def test_the_writer_who_authorised_last_is_the_one_judged(forge, polled):
    poll()  # alice assigned issue 1
    # The owner assigns it again: the owner now stands behind the work.
    as_user(forge, "team", "PATCH", "/issues/1", {"assignees": []})
    as_user(forge, "team", "PATCH", "/issues/1", {"assignees": ["worker-bot"]})
    assert poll()["tasks"] == {"unchanged": 1}
    conn = sqlite3.connect(polled)
    recorded = conn.execute("select actor from events where kind = 'task.authorized'").fetchall()
    conn.close()
    assert recorded == [("team",)]
    grant(forge, "alice", "read")
    assert poll()["paused"] == []
    assert states(polled) == {1: "ready"}


def test_an_assignment_by_a_read_only_user_pauses_the_task(forge, polled):
    poll()
    grant(forge, "reader", "write")
    as_user(forge, "reader", "PATCH", "/issues/1", {"assignees": []})
    as_user(forge, "reader", "PATCH", "/issues/1", {"assignees": ["worker-bot"]})
    grant(forge, "reader", "read")
    report = poll()
    assert [p["issue"] for p in report["paused"]] == [1]
    [refused] = report["unauthorized"]
    assert "assigned to worker-bot by reader, who has only read permission" in refused["reason"]


def test_a_relabel_by_someone_else_within_the_same_second_is_judged(forge, polled):
    state = forge.app.state
    forge.client("alice").add_labels("team", "app", 2, ["aiworker-plan"])
    poll()
    with state.lock:
        stamp = state.issue(state.repo("team", "app"), 2)["updated_at"]
    grant(forge, "reader", "write")
    reader = forge.client("reader")
    reader.remove_label("team", "app", 2, "aiworker-plan")
    reader.add_labels("team", "app", 2, ["aiworker-plan"])
    grant(forge, "reader", "read")
    # Within the second the first poll saw: the listing shows the very same issue.
    with state.lock:
        state.issue(state.repo("team", "app"), 2)["updated_at"] = stamp
        state.save()
    report = poll()
    assert report["polls"] == {"incremental": 1}
    assert [p["issue"] for p in report["paused"]] == [2]
    assert "labelled aiworker-plan by reader" in report["unauthorized"][0]["reason"]
    assert states(polled)[2] == "paused"


def test_a_claimed_task_whose_authoriser_was_demoted_pauses_and_spends_nothing(
    forge, claimed, upgraded
):
    from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc

    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    grant(forge, "alice", "read")
    implemented = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    report = implemented.json()
    assert (report["outcome"], report["state"]) == ("paused", "paused")
    assert "assigned to worker-bot by alice, who has only read permission" in report["reason"]
    assert query(upgraded, "select count(*) from attempts") == [(0,)]
    assert states(upgraded) == {1: "paused"}
    # Recorded as a pause, which a resumption reads the state to return to from.
    assert query(upgraded, "select from_state from events where kind = 'task.paused'") == [
        ("running",)
    ]
