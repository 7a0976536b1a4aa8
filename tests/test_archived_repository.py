"""A person archives the repository while its tasks are in flight: Forgejo then takes no
change to it (423 on the API, 403 on a push). No inference is spent on work that could
not be published, a step that meets the archive holds its task (paused, with the reason)
instead of trying again until its budget is spent, and it goes on once a person
unarchives the repository and resumes the task."""

from __future__ import annotations

import requests

from tests.helpers import run_process
from tests.test_delivery import REVIEW_OK, deliver_until, delivered  # noqa: F401 - fixture
from tests.test_doctor import checks_by_name
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc
from tests.test_people_on_the_forge import _held


def _archive(forge, archived: bool = True) -> None:
    response = requests.patch(
        f"{forge.url}/api/v1/repos/team/app",
        json={"archived": archived},
        headers={"Authorization": f"token {forge.tokens['team']}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert response.json()["archived"] is archived


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


def test_a_step_that_meets_the_archive_holds_its_task_until_it_is_lifted(
    forge,
    delivered,  # noqa: F811
    upgraded,
):
    task, _head = delivered(REVIEW_OK)
    pr = deliver_until(task, "publish")["publish"].json()["pr"]
    _archive(forge)
    ci = run_process("--json", "ci", "--task", str(task))  # its pending status: 423
    assert ci.exit_code == 1, ci
    reason = _held(upgraded, task)
    assert "HTTP 423: repo is archived; a person must unarchive the repository" in reason
    # Before, each try failed the same way until the CI budget was spent.
    assert query(upgraded, "select count(*) from attempts where phase = 'ci'") == [(1,)]
    _archive(forge, False)
    assert run_process("task", "resume", str(task)).exit_code == 0
    reports = deliver_until(task, "ci", "review", "merge")
    assert all(r.exit_code == 0 for r in reports.values()), reports
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
