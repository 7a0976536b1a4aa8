"""A person archives the repository while its tasks are in flight: Forgejo then takes no
change to it (423 on the API, 403 on a push). No inference is spent on work that could
not be published, a step that meets the archive holds its task (paused, with the reason)
instead of trying again until its budget is spent, and it goes on once a person
unarchives the repository and resumes the task."""

from __future__ import annotations

from tests.helpers import run_process
from tests.test_delivery import REVIEW_OK, deliver_until, delivered  # noqa: F401 - fixture
from tests.test_doctor import checks_by_name
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc
from tests.test_people_on_the_forge import _held


def _archive(forge, archived: bool = True) -> None:
    assert forge.as_user("team", "PATCH", "", {"archived": archived})["archived"] is archived


def test_no_inference_is_spent_on_an_archived_repository(forge, claimed, upgraded, cli):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    _archive(forge)
    assert checks_by_name(cli("--json", "doctor"))["repository:team/app"] == {
        "name": "repository:team/app",
        "status": "fail",
        "detail": "archived on the forge: it takes no change",
    }
    implemented = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert implemented.exit_code == 1, implemented
    assert "team/app is archived on the forge" in _held(upgraded, task)
    assert query(upgraded, "select provider from attempts") == [(None,)]  # no provider ran


def test_a_review_spends_no_inference_on_an_archived_repository(
    forge,
    delivered,  # noqa: F811
    upgraded,
):
    task, _head = delivered(REVIEW_OK)
    reports = deliver_until(task, "publish", "ci")
    assert all(r.exit_code == 0 for r in reports.values()), reports
    _archive(forge)
    # Before, the model reviewed it, and its verdict could not be acted on.
    review = run_process("--json", "review", "--task", str(task))
    assert review.exit_code == 1, review
    assert "team/app is archived on the forge" in _held(upgraded, task)
    assert query(upgraded, "select provider from attempts where phase = 'review'") == [(None,)]


def test_a_merge_refused_for_the_archive_holds_its_task_until_it_is_lifted(
    forge,
    delivered,  # noqa: F811
    upgraded,
):
    task, _head = delivered(REVIEW_OK)
    reports = deliver_until(task, "publish", "ci", "review")
    assert all(r.exit_code == 0 for r in reports.values()), reports
    pr = reports["publish"].json()["pr"]
    _archive(forge)
    merged = run_process("--json", "merge", "--task", str(task))  # Forgejo's 423
    assert merged.exit_code == 1, merged
    reason = _held(upgraded, task)
    assert "HTTP 423: repo is archived; a person must unarchive the repository" in reason
    # Before, each try failed the same way until the merge budget was spent.
    assert query(upgraded, "select count(*) from attempts where phase = 'merge'") == [(1,)]
    _archive(forge, False)
    assert run_process("task", "resume", str(task)).exit_code == 0
    assert run_process("--json", "merge", "--task", str(task)).exit_code == 0
    assert forge.client("alice").pull("team", "app", pr).merged


def test_a_push_to_an_archived_repository_holds_its_task(
    forge,
    delivered,  # noqa: F811
    upgraded,
):
    task, _head = delivered()
    _archive(forge)
    published = run_process("--json", "publish", "--task", str(task))
    assert published.exit_code in (1, 2), published
    reason = _held(upgraded, task)
    assert "the forge refused git push (HTTP 403: This repo is archived" in reason, reason
    assert forge.client("alice").pulls("team", "app", state="all") == []
