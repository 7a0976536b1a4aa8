"""`aiworker poll` against the sandbox forge: kinds, authorisation, pausing, fingerprints."""

from __future__ import annotations

import json
import sqlite3

import pytest

from aiworker.sandbox.seed import COLLABORATORS
from tests.helpers import configure, run_process


def snapshot(db_path) -> dict:
    conn = sqlite3.connect(db_path)
    tables = [r[0] for r in conn.execute("select name from sqlite_master where type='table'")]
    data = {t: conn.execute(f"select * from {t} order by 1").fetchall() for t in tables}
    conn.close()
    return data


def tasks(db_path) -> dict[int, tuple]:
    conn = sqlite3.connect(db_path)
    rows = conn.execute("select issue_number, kind, state, scope_fingerprint from tasks").fetchall()
    conn.close()
    return {row[0]: row[1:] for row in rows}


def events(db_path, kind) -> list:
    conn = sqlite3.connect(db_path)
    rows = conn.execute("select task_id, data from events where kind = ?", (kind,)).fetchall()
    conn.close()
    return rows


@pytest.fixture
def polled(forge, upgraded, tmp_path, monkeypatch):
    configure(tmp_path, forge, monkeypatch)
    return upgraded


def poll():
    result = run_process("--json", "poll")
    assert result.exit_code == 0, result
    return result.json()


def test_assigned_and_labelled_issues_become_tasks_of_their_kind(forge, polled):
    alice = forge.client("alice")
    alice.add_labels("team", "app", 2, ["aiworker-plan"])
    alice.ensure_labels("team", "app", ["aiworker-feature"])
    issue = forge.app.state.add_issue(forge.app.state.repo("team", "app"), "alice", "feature x")
    alice.add_labels("team", "app", issue["number"], ["aiworker-feature"])
    report = poll()
    assert report["tasks"] == {"created": 3}
    assert {n: t[:2] for n, t in tasks(polled).items()} == {
        1: ("issue", "ready"),
        2: ("plan", "ready"),
        issue["number"]: ("feature", "ready"),
    }


def test_second_poll_adds_nothing_and_writes_nothing(forge, polled):
    poll()
    # The first incremental poll may move the cursor to an issue the full poll did not list
    # (one that asks for no work, updated a second later); after that, nothing moves.
    poll()
    before = snapshot(polled)
    report = poll()
    # The issues of the cursor's second are listed again and those asking for work judged
    # again (whole-second timestamps hide a change made later within it): unchanged, and
    # nothing is written.
    assert report["polls"] == {"incremental": 1}
    assert set(report["tasks"]) <= {"unchanged"}
    assert snapshot(polled) == before
    # A forced full poll judges the issue again: unchanged.
    assert run_process("--json", "poll", "--full").json()["tasks"] == {"unchanged": 1}


def test_label_from_a_read_only_user_creates_no_task(forge, polled):
    owner = forge.client("team")
    owner.add_collaborator("team", "app", "reader", "write")
    forge.client("reader").add_labels("team", "app", 2, ["aiworker-plan"])
    owner.add_collaborator("team", "app", "reader", "read")
    report = poll()
    assert list(tasks(polled)) == [1]
    [refused] = report["unauthorized"]
    assert refused["issue"] == 2
    assert "reader, who has only read permission" in refused["reason"]


def test_without_an_operator_only_bots_and_the_owner_can_authorise(
    forge, upgraded, tmp_path, monkeypatch
):
    configure(tmp_path, forge, monkeypatch, operator=False)
    forge.client("alice").add_labels("team", "app", 2, ["aiworker-plan"])
    report = poll()
    assert list(tasks(upgraded)) == []  # issue 1 was assigned by alice too
    reasons = [item["reason"] for item in report["unauthorized"]]
    assert all("configure forge.identities.operator" in r for r in reasons)
    owner = forge.client("team")
    owner.remove_label("team", "app", 2, "aiworker-plan")
    owner.add_labels("team", "app", 2, ["aiworker-plan"])
    assert poll()["tasks"] == {"created": 1}
    assert tasks(upgraded)[2][:2] == ("plan", "ready")
    doctor = run_process("--json", "doctor").json()
    assert any(c["name"] == "operator" and c["status"] == "warn" for c in doctor["checks"])


def test_removing_the_label_pauses_and_restoring_resumes(forge, polled):
    alice = forge.client("alice")
    alice.add_labels("team", "app", 2, ["aiworker-plan"])
    poll()
    alice.remove_label("team", "app", 2, "aiworker-plan")
    report = poll()
    assert [p["issue"] for p in report["paused"]] == [2]
    assert tasks(polled)[2][1] == "paused"
    assert events(polled, "task.paused")
    alice.add_labels("team", "app", 2, ["aiworker-plan"])
    assert poll()["tasks"]["resumed"] == 1
    assert tasks(polled)[2][1] == "ready"


def test_editing_the_body_changes_the_fingerprint(forge, polled):
    poll()
    before = tasks(polled)[1][2]
    forge.as_user("alice", "PATCH", "/issues/1", {"body": "Also handle negative numbers."})
    report = poll()
    assert report["tasks"] == {"updated": 1}
    after = tasks(polled)[1][2]
    assert after != before
    [(_task_id, data)] = events(polled, "task.scope_changed")
    assert before in data
    assert after in data


def _set_state(db_path, number: int, state: str) -> None:
    """Put issue NUMBER's task in STATE, as the delivery steps would have."""
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute(
            "update tasks set state = ?, version = version + 1 where issue_number = ?",
            (state, number),
        )
    conn.close()


def test_a_paused_task_resumes_where_it_was_paused(forge, polled):
    poll()
    _set_state(polled, 1, "awaiting_review")

    def assign(logins):
        forge.as_user("alice", "PATCH", "/issues/1", {"assignees": logins})

    assign([])
    assert [p["issue"] for p in poll()["paused"]] == [1]
    assert tasks(polled)[1][1] == "paused"
    assign(["worker-bot"])
    assert poll()["tasks"] == {"resumed": 1}
    assert tasks(polled)[1][1] == "awaiting_review"
    # An approved task is left to merge (its issue closes when the PR merges).
    _set_state(polled, 1, "approved")
    assign([])
    assert poll()["paused"] == []
    assert tasks(polled)[1][1] == "approved"


def test_polls_between_full_ones_list_only_what_changed(forge, polled):

    first = poll()
    assert first["polls"] == {"full": 1}
    second = poll()
    assert second["polls"] == {"incremental": 1}
    # Only the issue of the cursor's second is listed again (since= is inclusive, in whole
    # seconds) and judged again: unchanged.
    assert second["tasks"] == {"unchanged": 1}

    def patch(number, **fields):
        forge.as_user("alice", "PATCH", f"/issues/{number}", fields)

    patch(2, assignees=["worker-bot"])  # newly assigned: picked up incrementally
    third = poll()
    assert third["polls"] == {"incremental": 1}
    assert third["tasks"].get("created") == 1
    patch(1, state="closed")  # closed: its task is paused by an incremental poll
    fourth = poll()
    assert [p["issue"] for p in fourth["paused"]] == [1]
    assert {n: t[1] for n, t in tasks(polled).items()} == {1: "paused", 2: "ready"}


def test_a_title_longer_than_forgejo_keeps_is_recorded_cut(forge, polled):
    """Forgejo's titles hold 255 characters; a forge that sends far more would have
    every list of tasks repeat it."""
    repo = forge.app.state.repo("team", "app")
    number = forge.app.state.add_issue(repo, "alice", "x" * 20_000)["number"]
    forge.client("alice").ensure_labels("team", "app", ["aiworker-feature"])
    forge.client("alice").add_labels("team", "app", number, ["aiworker-feature"])
    poll()
    conn = sqlite3.connect(polled)
    [(title,)] = conn.execute("select title from tasks where issue_number = ?", (number,))
    conn.close()
    assert (len(title), title[-1]) == (500, "…")


def test_another_repository_put_at_a_recorded_index_is_refused_not_taken_for_a_rename(
    forge, polled, tmp_path
):
    """Two installations sharing one database give index 1 to different repositories (or
    an operator edits the wrong entry): the poll refuses, naming both, instead of
    rebinding every task of index 1 to the other repository's issues."""
    state = forge.app.state
    other = state.add_repo("team", "other")
    other["collaborators"].update(COLLABORATORS)
    issue = state.add_issue(other, "alice", "Delete everything", "Another project.")
    issue["assignees"] = ["worker-bot"]
    state.record(issue, "assignees", "alice", assignee="worker-bot")
    assert poll()["tasks"] == {"created": 1}
    app_id, other_id = state.repo("team", "app")["id"], other["id"]
    before = snapshot(polled)["tasks"]
    config = tmp_path / "config.toml"
    # Index 1 given to team/other by mistake: index 2 (another repository) is polled still.
    state.add_repo("team", "third")["collaborators"].update(COLLABORATORS)
    config.write_text(
        config.read_text().replace('name = "app"', 'name = "other"')
        + '[[repositories]]\nindex = 2\nowner = "team"\nname = "third"\n'
    )
    refused = run_process("--json", "poll")
    assert refused.exit_code == 2, refused
    assert refused.json()["error"]["message"] == (
        f"repositories[index=1] is team/other, but index 1 stands for team/app (forge "
        f"repository {app_id}), and team/other is another repository (forge repository "
        f"{other_id}), not a rename of it: give it an index of its own (every installation "
        "sharing this database must give each repository the same index)"
    )
    after = snapshot(polled)
    assert after["tasks"] == before  # index 1's task is left as it was
    assert [(r[1], r[2], r[3]) for r in after["repositories"]] == [
        (1, "team", "app"),
        (2, "team", "third"),
    ]
    config.write_text(config.read_text().replace('name = "other"', 'name = "app"', 1))
    assert poll()["tasks"] == {"unchanged": 1}

    # A rename keeps the forge's id (the sandbox renames nothing: the index is recorded
    # under the name it had before), and so does a name recorded before ids were, which
    # the forge no longer knows.
    conn = sqlite3.connect(polled)
    with conn:
        conn.execute("update repositories set name = 'app-before' where \"index\" = 1")
    poll()
    with conn:
        conn.execute("update repositories set name = 'app-gone', settings = '{}' where id = 1")
    poll()
    renames = conn.execute("select data from events where kind = 'repository.renamed'")
    assert [json.loads(data)["from"] for (data,) in renames] == ["team/app-before", "team/app-gone"]
    [(owner, name, settings)] = conn.execute(
        "select owner, name, settings from repositories where id = 1"
    )
    assert (owner, name, json.loads(settings)["forge_id"]) == ("team", "app", app_id)
    conn.close()
    assert tasks(polled)[1][1] == "ready"


def test_a_phase_run_on_a_task_not_claimed_says_what_the_task_is(forge, polled):
    """An operator runs a slot phase by hand on a task the tick has not claimed yet."""
    poll()
    result = run_process("--json", "implement", "--task", "1", "--slot", "1")
    assert result.exit_code == 1, result
    assert result.json()["error"]["message"] == "task 1 is ready, not claimed on slot 1"
