"""Scoped access tokens: Forgejo asks for a token's scopes when it is made, and a bot
whose token lacks one (write:repository to push, write:issue to comment) is refused
with 403 on every request that needs it. doctor names the scopes each bot's token
lacks; a step refused for a scope holds its task for the operator instead of trying
again until its budget is spent."""

from __future__ import annotations

import requests

from tests.helpers import configure, run_process
from tests.test_delivery import deliver_until, delivered  # noqa: F401 - fixture
from tests.test_doctor import checks_by_name
from tests.test_implement import query
from tests.test_people_on_the_forge import _held


def _scoped_token(forge, login: str, *scopes: str) -> str:
    """A new token of LOGIN holding SCOPES, made as a person makes one."""
    response = requests.post(
        f"{forge.url}/api/v1/users/{login}/tokens",
        json={"name": "narrow", "scopes": list(scopes)},
        auth=(login, forge.tokens[login]),
        timeout=10,
    )
    assert response.status_code == 201, response.text
    return str(response.json()["sha1"])


READS = ("read:user", "read:repository", "read:issue")


def test_doctor_names_the_scopes_a_bots_token_lacks(cli, upgraded, forge, tmp_path, monkeypatch):
    configure(tmp_path, forge, monkeypatch)
    checks = checks_by_name(cli("--json", "doctor"))
    assert checks["scopes:worker"] == {
        "name": "scopes:worker",
        "status": "ok",
        "detail": "holds write:repository, write:issue",
    }
    narrow = _scoped_token(forge, "worker-bot", *READS)
    monkeypatch.setenv("AIWORKER_TEST_WORKER_TOKEN", narrow)
    result = cli("--json", "doctor")
    assert result.exit_code == 1, result
    checks = checks_by_name(result)
    assert checks["identity:worker"]["status"] == "ok"  # the token itself is accepted
    assert checks["scopes:worker"]["status"] == "fail"
    assert checks["scopes:worker"]["detail"] == (
        "the token lacks write:repository (to push and open pull requests), write:issue "
        "(to comment); give it those scopes on the forge"
    )
    assert checks["scopes:reviewer"]["status"] == "ok"
    assert narrow not in result.stdout
    # A token without read:user: named for the scope, not as a token the forge refuses.
    monkeypatch.setenv(
        "AIWORKER_TEST_WORKER_TOKEN",
        _scoped_token(forge, "worker-bot", "write:repository", "write:issue"),
    )
    identity = checks_by_name(cli("--json", "doctor"))["identity:worker"]
    assert identity["status"] == "fail"
    assert "required scope(s): [read:user]" in identity["detail"], identity
    # Asking wrote nothing: no comment, no pull request.
    worker = forge.client("worker-bot")
    assert [p.number for p in worker.pulls("team", "app", state="all")] == []
    assert worker.comments("team", "app", 1) == []


def test_a_step_refused_for_a_tokens_scope_holds_its_task(forge, delivered, upgraded):  # noqa: F811
    task, _head = delivered()
    published = deliver_until(task, "publish")["publish"]
    assert published.exit_code == 0, published
    # The worker's token is replaced by one that may read but not write the repository:
    # CI's commit status is refused. Before, each try failed the same way until the CI
    # budget was spent and the task failed.
    narrow = _scoped_token(forge, "worker-bot", *READS, "write:issue")
    ci = run_process(
        "--json", "ci", "--task", str(task), env={"AIWORKER_TEST_WORKER_TOKEN": narrow}
    )
    assert ci.exit_code == 2, ci
    assert ci.json()["error"]["code"] == "forge_token_scope"
    reason = _held(upgraded, task)
    assert "token does not have at least one of required scope(s): [write:repository]" in reason
    assert "give this identity's token that scope" in reason
    assert narrow not in reason
    assert query(upgraded, "select count(*) from attempts where phase = 'ci'") == [(1,)]


def test_a_push_refused_for_a_tokens_scope_holds_its_task(forge, delivered, upgraded):  # noqa: F811
    task, _head = delivered()
    narrow = _scoped_token(forge, "worker-bot", *READS, "write:issue")
    published = run_process(
        "--json", "publish", "--task", str(task), env={"AIWORKER_TEST_WORKER_TOKEN": narrow}
    )
    assert published.exit_code == 2, published
    reason = _held(upgraded, task)
    assert "the forge refused git push (HTTP 403)" in reason
    assert narrow not in reason
    assert forge.client("worker-bot").pulls("team", "app", state="all") == []


def test_an_operator_token_without_its_scope_stops_the_poll_instead_of_refusing_authors(
    cli, upgraded, forge, tmp_path, monkeypatch
):
    configure(tmp_path, forge, monkeypatch)
    narrow = _scoped_token(forge, "admin", "read:user", "read:issue")
    monkeypatch.setenv("AIWORKER_TEST_OPERATOR_TOKEN", narrow)
    assert checks_by_name(cli("--json", "doctor"))["scopes:operator"]["status"] == "fail"
    # Before, every author's permission read as unknown: no task, and no word why.
    polled = cli("--json", "poll")
    assert polled.exit_code == 2, polled
    assert "required scope(s): [read:repository]" in polled.stdout
    assert query(upgraded, "select count(*) from tasks") == [(0,)]
