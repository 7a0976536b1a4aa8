"""The operator API over real HTTP against a running `aiworker web serve`: request protection
refuses forged hosts, foreign origins and missing CSRF tokens without changing anything;
settings are saved like `config set`; actions reach the scheduler; no secret is served."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
import requests

from tests.helpers import run_process

CANARY = "canary-token-5f1d0c2b9e"


@contextmanager
def serving(*extra: str):
    """`aiworker web serve` on a free loopback port, with this process's environment."""
    process = subprocess.Popen(
        [sys.executable, "-m", "aiworker", "web", "serve", "--listen", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("aiworker web at http://127.0.0.1:"), line
        yield line.split(" at ", 1)[1].strip().rstrip("/")
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()


@pytest.fixture
def web(upgraded, state_dir, tmp_path, monkeypatch):
    config = tmp_path / "config.toml"
    config.write_text(
        'shares = 2\n[forge]\nurl = "http://127.0.0.1:9"\n'
        '[forge.identities.worker]\ntoken_env = "AIWORKER_TEST_WEB_TOKEN"\n'
    )
    os.chmod(config, 0o600)
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))
    monkeypatch.setenv("AIWORKER_TEST_WEB_TOKEN", CANARY)
    with serving() as url:
        yield url, config


def session(url):
    """A browser-like client: the CSRF cookie and header from GET /api/v1/session."""
    client = requests.Session()
    token = client.get(f"{url}/api/v1/session", timeout=10).json()["csrf_token"]
    client.headers["X-CSRF-Token"] = token
    return client


def paused():
    return run_process("--json", "scheduler", "status").json()["paused"]


def test_request_protection_refuses_and_changes_nothing(web):
    url, _ = web
    client = session(url)
    forged = client.post(f"{url}/api/v1/actions/pause", headers={"Host": "evil.example"})
    assert (forged.status_code, forged.json()["error"]["code"]) == (421, "forbidden_host")
    assert "--public-origin" in forged.json()["error"]["message"]
    read = requests.get(f"{url}/api/v1/status", headers={"Host": "attacker:80"}, timeout=10)
    assert read.status_code == 421
    foreign = client.post(f"{url}/api/v1/actions/pause", headers={"Origin": "http://evil.example"})
    assert (foreign.status_code, foreign.json()["error"]["code"]) == (403, "forbidden_origin")
    bare = requests.post(f"{url}/api/v1/actions/pause", timeout=10)
    assert (bare.status_code, bare.json()["error"]["code"]) == (403, "csrf")
    wrong = requests.post(
        f"{url}/api/v1/actions/pause",
        headers={"X-CSRF-Token": "guess"},
        cookies={"aiworker_csrf": "other"},
        timeout=10,
    )
    assert wrong.status_code == 403
    # A token the server never issued, set by the client in both places, is refused.
    for made_up in ("x", "a" * 43, "nonce.mac"):
        forged = requests.post(
            f"{url}/api/v1/actions/pause",
            headers={"X-CSRF-Token": made_up},
            cookies={"aiworker_csrf": made_up},
            timeout=10,
        )
        assert (forged.status_code, forged.json()["error"]["code"]) == (403, "csrf"), made_up
    huge = client.post(f"{url}/api/v1/actions/pause", data=b"{" + b" " * 70_000 + b"}")
    assert (huge.status_code, huge.json()["error"]["code"]) == (413, "too_large")
    # Sent in chunks, with no length to judge it by: refused the same way once past 64 KiB.
    chunked = client.post(
        f"{url}/api/v1/actions/pause",
        data=(b"{" if n == 0 else b" " * 8192 for n in range(10)),
        headers={"Content-Type": "application/json"},
    )
    assert (chunked.status_code, chunked.json()["error"]["code"]) == (413, "too_large")
    assert paused() is False
    # The page's own origin is accepted; a small body in chunks is read whole.
    own = client.post(
        f"{url}/api/v1/actions/pause",
        headers={"Origin": url, "Content-Type": "application/json"},
        data=iter([b'{"reason": ', b'"sent in', b' chunks"}']),
    )
    assert own.status_code == 200, own.text
    assert (own.json()["reason"], paused()) == ("sent in chunks", True)


def test_actions_go_through_the_scheduler_controls(web):
    url, _ = web
    client = session(url)
    result = client.post(f"{url}/api/v1/actions/pause", json={"reason": "maintenance window"})
    assert result.json() == {
        "paused": True,
        "reason": "maintenance window",
        "already": False,
        "paused_by": "the web control plane",
        "pending": None,
    }
    # A second pause says the first stands, as the CLI's does.
    again = client.post(f"{url}/api/v1/actions/pause", json={"reason": "another"}).json()
    assert (again["already"], again["reason"]) == (True, "maintenance window")
    status = client.get(f"{url}/api/v1/status").json()
    assert (status["paused"], status["paused_reason"]) == (True, "maintenance window")
    assert client.post(f"{url}/api/v1/actions/resume").json() == {"paused": False}
    assert paused() is False
    unconfirmed = client.post(f"{url}/api/v1/actions/stop-slot", json={"slot": 1, "confirm": False})
    assert (unconfirmed.status_code, unconfirmed.json()["error"]["code"]) == (400, "invalid_input")
    idle = client.post(f"{url}/api/v1/actions/stop-slot", json={"slot": 1, "confirm": True})
    assert (idle.status_code, idle.json()["error"]["message"]) == (409, "slot 1 runs no job")
    outside = client.post(f"{url}/api/v1/actions/stop-slot", json={"slot": 3, "confirm": True})
    assert outside.status_code == 400


def test_settings_are_saved_atomically_with_the_revision_check(web):
    url, config = web
    client = session(url)
    settings = client.get(f"{url}/api/v1/settings").json()
    revision = settings["revision"]
    assert settings["config"]["shares"] == 2
    before = config.read_bytes()
    refusals = [
        ({"revision": "0" * 64, "values": {"shares": 3}}, 409, "conflict"),
        ({"revision": revision, "values": {"shares": 9}}, 400, "config_invalid"),
        ({"revision": revision, "values": {"forge.url": "http://x"}}, 400, "invalid_input"),
        ({"revision": revision, "values": {"shares": 3}, "extra": 1}, 400, "invalid_input"),
        ({"revision": revision, "values": {"budgets.repair": "many"}}, 400, "config_invalid"),
    ]
    for body, status, code in refusals:
        refused = client.put(f"{url}/api/v1/settings", json=body)
        assert (refused.status_code, refused.json()["error"]["code"]) == (status, code), body
        assert config.read_bytes() == before  # nothing is half-written
    assert (
        "shares"
        in client.put(
            f"{url}/api/v1/settings", json={"revision": revision, "values": {"shares": 9}}
        ).json()["error"]["details"][0]
    )
    saved = client.put(
        f"{url}/api/v1/settings",
        json={
            "revision": revision,
            "values": {"shares": 3, "phases.review.providers.codex.model": "gpt-5-codex"},
        },
    )
    assert saved.status_code == 200, saved.text
    assert saved.json()["revision"] != revision
    assert config.stat().st_mode & 0o777 == 0o600
    shown = run_process("--json", "config", "show").json()
    assert shown["config"]["shares"] == 3
    assert shown["config"]["phases"]["review"]["providers"]["codex"]["model"] == "gpt-5-codex"
    assert client.get(f"{url}/api/v1/settings").json()["revision"] == saved.json()["revision"]


def test_reads_match_the_cli_and_never_show_a_secret(web, state_dir):
    url, _ = web
    client = requests.Session()
    served = [
        client.get(f"{url}{path}", timeout=10)
        for path in ("/api/v1/status", "/api/v1/settings", "/api/v1/capabilities", "/")
    ]
    assert all(r.status_code == 200 for r in served)
    assert all(CANARY not in r.text for r in served)
    tokens = served[1].json()["tokens"]
    assert tokens["worker"] == {
        "source": "env:AIWORKER_TEST_WEB_TOKEN",
        "present": True,
        "state": "present",
    }
    logs = state_dir / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "task-7.log").write_text(f"started\nAuthorization: token {CANARY}\nended\n")
    tail = client.get(f"{url}/api/v1/tasks/7/logs", timeout=10).json()
    assert "ended" in tail["tail"]
    assert CANARY not in tail["tail"]
    # What no handler expects is answered in the error shape too, not a text page.
    (logs / "task-7.log").unlink()
    (logs / "task-7.log").mkdir()
    broken = client.get(f"{url}/api/v1/tasks/7/logs", timeout=10)
    assert broken.status_code == 500
    assert broken.json()["error"]["code"] == "internal"
    assert "IsADirectoryError" in broken.json()["error"]["message"]
    assert str(logs) not in broken.text  # its details are for the server's log
    missing = client.get(f"{url}/api/v1/tasks/999", timeout=10)
    assert (missing.status_code, missing.json()["error"]["message"]) == (404, "no task 999")
    no_log = client.get(f"{url}/api/v1/tasks/999/logs", timeout=10)
    assert (no_log.status_code, no_log.json()["error"]["message"]) == (404, "no task 999")
    caps = served[2].json()
    assert caps["providers"]["script"] == ["enabled"]
    assert "forge" in caps["read_only"]
    document = client.get(f"{url}/api/v1/openapi.json", timeout=10).json()
    assert document["openapi"].startswith("3.")
    for path in (
        "/api/v1/session",
        "/api/v1/status",
        "/api/v1/tasks",
        "/api/v1/tasks/{task_id}",
        "/api/v1/tasks/{task_id}/logs",
        "/api/v1/settings",
        "/api/v1/capabilities",
        "/api/v1/actions/start-now",
        "/api/v1/actions/pause",
        "/api/v1/actions/resume",
        "/api/v1/actions/stop-slot",
    ):
        assert path in document["paths"], path


def test_tasks_are_served_as_the_cli_shows_them(web, upgraded):
    from aiworker.store.engine import Database
    from aiworker.store.task_records import create_task, ensure_repository

    url, _ = web
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session_:
        repo = ensure_repository(session_, 1, "team", "app")
        for number in range(1, 8):
            create_task(session_, repo.id, "issue", issue_number=number, title=f"issue {number}")
    db.dispose()
    first = requests.get(f"{url}/api/v1/tasks?limit=5", timeout=10).json()
    assert [t["id"] for t in first["tasks"]] == [1, 2, 3, 4, 5]
    rest = requests.get(f"{url}/api/v1/tasks?limit=5&after={first['next_after']}", timeout=10)
    assert [t["id"] for t in rest.json()["tasks"]] == [6, 7]
    shown = requests.get(f"{url}/api/v1/tasks/3", timeout=10).json()
    # The CLI's record, with links to the forge added for the page.
    assert shown.pop("issue_url") == "http://127.0.0.1:9/team/app/issues/3"
    assert shown == run_process("--json", "task", "show", "3").json()
    assert first["tasks"][0]["issue_url"] == "http://127.0.0.1:9/team/app/issues/1"
    bad = requests.get(f"{url}/api/v1/tasks?state=sleeping", timeout=10)
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_input")


def test_a_non_loopback_address_needs_an_explicit_flag():
    refused = run_process("--json", "web", "serve", "--listen", "0.0.0.0:0")
    assert refused.exit_code == 2
    assert "--allow-remote" in refused.json()["error"]["message"]
    malformed = run_process("--json", "web", "serve", "--listen", "somewhere")
    assert malformed.exit_code == 2


def test_under_json_serve_says_where_it_listens_in_one_document_once_all_is_bound(upgraded):
    """A script reads one JSON document saying both addresses; a runner address that is
    taken is refused before anything was announced, so its error is all that is said."""
    import json
    import socket

    argv = [sys.executable, "-m", "aiworker", "--json", "web", "serve", "--listen", "127.0.0.1:0"]
    process = subprocess.Popen(
        [*argv, "--runner-listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True
    )
    try:
        said = json.loads(process.stdout.readline())
        assert said["web"].startswith("http://127.0.0.1:")
        assert said["runner_api"].startswith("http://127.0.0.1:")
        assert said["warning"] is None
        assert requests.get(f"{said['web']}api/v1/session", timeout=10).status_code == 200
    finally:
        process.terminate()
        process.communicate(timeout=10)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        refused = run_process(*argv[3:], "--runner-listen", f"127.0.0.1:{port}")
    finally:
        taken.close()
    assert refused.exit_code == 75, refused
    assert list(json.loads(refused.stdout)) == ["error"]  # one document: the refusal


def test_providers_are_shown_from_stored_readings_with_their_age(web, upgraded, monkeypatch):
    from datetime import UTC, datetime, timedelta

    from aiworker.store.engine import Database
    from aiworker.store.models import ProviderObservation

    url, config = web
    config.write_text('providers = ["codex", "script"]\n' + config.read_text())
    db = Database(f"sqlite:///{upgraded}")
    now = datetime.now(UTC)
    with db.write() as session_:
        for provider, age, used in (("codex", 3600, 40.0), ("script", 5, 10.0)):
            session_.add(
                ProviderObservation(
                    provider=provider,
                    window="5h",
                    used_percent=used,
                    resets_at=None,
                    observed_at=now - timedelta(seconds=age),
                    valid=True,
                    source="test",
                    reason="eligible",
                )
            )
    db.dispose()
    shown = requests.get(f"{url}/api/v1/providers", timeout=10).json()
    readings = {r["provider"]: r for r in shown["readings"]}
    assert readings["codex"]["stale"] is True
    assert readings["codex"]["age_s"] >= 3600
    assert (readings["script"]["stale"], readings["script"]["used_percent"]) == (False, 10.0)
    events = requests.get(f"{url}/api/v1/events?limit=5", timeout=10).json()
    assert events == {"events": [], "next_before": None}


def test_behind_a_reverse_proxy_its_public_name_is_accepted(web):
    _, _ = web
    with serving("--public-origin", "https://aiworker.example.org") as url:
        token = requests.get(f"{url}/api/v1/session", timeout=10).json()["csrf_token"]
        proxy = {
            "Host": "aiworker.example.org",
            "X-CSRF-Token": token,
            "Cookie": f"aiworker_csrf={token}",
        }
        proxied = requests.post(
            f"{url}/api/v1/actions/pause",
            headers={**proxy, "Origin": "https://aiworker.example.org"},
            timeout=10,
        )
        assert proxied.status_code == 200, proxied.text
        other = requests.post(
            f"{url}/api/v1/actions/resume",
            headers={**proxy, "Origin": "https://elsewhere.example.org"},
            timeout=10,
        )
        assert other.status_code == 403
    bad = run_process("--json", "web", "serve", "--public-origin", "ftp://x/y")
    assert bad.exit_code == 2


def test_a_second_tab_shares_the_token_and_a_stray_cookie_does_not_hide_it(web):
    url, _ = web
    first = requests.Session()
    token = first.get(f"{url}/api/v1/session", timeout=10).json()["csrf_token"]
    again = first.get(f"{url}/api/v1/session", timeout=10).json()["csrf_token"]
    assert again == token
    # Another localhost application's malformed cookie beside ours.
    mutated = requests.post(
        f"{url}/api/v1/actions/resume",
        headers={"X-CSRF-Token": token, "Cookie": f'x=a"b\\; other=1; aiworker_csrf={token}'},
        timeout=10,
    )
    assert mutated.status_code == 200, mutated.text
    # Another localhost page's cookie of our name, on a longer path: sent first, it must
    # not lock the operator out of every change.
    shadowed = requests.post(
        f"{url}/api/v1/actions/resume",
        headers={"X-CSRF-Token": token, "Cookie": f"aiworker_csrf=junk; aiworker_csrf={token}"},
        timeout=10,
    )
    assert shadowed.status_code == 200, shadowed.text
    forged = requests.post(
        f"{url}/api/v1/actions/resume",
        headers={"X-CSRF-Token": "junk", "Cookie": f"aiworker_csrf=junk; aiworker_csrf={token}"},
        timeout=10,
    )
    assert forged.status_code == 403
    odd = requests.post(
        f"{url}/api/v1/actions/resume",
        headers={
            "X-CSRF-Token": "\u00e9t\u00e9".encode().decode("latin-1"),
            "Cookie": "aiworker_csrf=x",
        },
        timeout=10,
    )
    assert odd.status_code == 403


def test_every_answer_says_nosniff_and_the_page_runs_no_inline_script(web):
    url, _ = web
    client = session(url)
    answers = [
        client.get(f"{url}/api/v1/status"),
        client.get(f"{url}/api/v1/tasks/99"),  # an error
        requests.get(f"{url}/api/v1/status", headers={"Host": "evil:1"}, timeout=10),
        requests.post(f"{url}/api/v1/actions/pause", timeout=10),  # refused by protection
        client.get(url + "/"),
        client.get(url + "/page.js"),
    ]
    for answer in answers:
        assert answer.headers["x-content-type-options"] == "nosniff", answer.url
    page = answers[4]
    policy = page.headers["content-security-policy"]
    script_src = next(p for p in policy.split(";") if p.strip().startswith("script-src"))
    assert script_src.split() == ["script-src", "'self'"]
    assert "<script>" not in page.text
    assert '<script src="/page.js"></script>' in page.text
    assert answers[5].headers["content-type"].startswith("text/javascript")


def test_an_issued_token_outlives_a_restart_of_the_server(upgraded, state_dir, monkeypatch):
    with serving() as url:
        client = session(url)
    with serving() as url:
        assert client.post(f"{url}/api/v1/actions/pause", json={}).status_code == 200
    key = state_dir / "web" / "csrf.key"
    assert key.stat().st_mode & 0o777 == 0o600


HAND_WRITTEN = """\
# aiworker on build-3 (ops team, ticket OPS-112)
shares = 2  # two slots: this host has 8 GiB

[forge]
# the company forge
url = "http://127.0.0.1:9"

[forge.identities.worker]
token_env = "AIWORKER_TEST_WEB_TOKEN"  # from the unit's EnvironmentFile

# budgets agreed with finance
[budgets]
implementation = 3
"""


def test_edits_keep_the_comments_order_and_layout_of_a_hand_written_file(web):
    url, config = web
    config.write_text(HAND_WRITTEN)
    for key, value in (("shares", "3"), ("budgets.repair", "2"), ("forge.url", "http://h:3000")):
        assert run_process("config", "set", key, value).exit_code == 0
    client = session(url)
    revision = client.get(f"{url}/api/v1/settings").json()["revision"]
    saved = client.put(
        f"{url}/api/v1/settings",
        json={"revision": revision, "values": {"budgets.implementation": 5}},
    )
    assert saved.status_code == 200, saved.text
    expected = (
        HAND_WRITTEN.replace("shares = 2", "shares = 3")
        .replace('url = "http://127.0.0.1:9"', 'url = "http://h:3000"')
        .replace("implementation = 3\n", "implementation = 5\nrepair = 2\n")
    )
    assert config.read_text() == expected
    assert config.stat().st_mode & 0o777 == 0o600
    shown = run_process("--json", "config", "show").json()["config"]
    assert (shown["shares"], shown["budgets"]["implementation"]) == (3, 5)


def test_task_actions_need_the_csrf_token_and_a_confirmed_cancel(web, upgraded):
    from aiworker.store.engine import Database
    from aiworker.store.task_records import create_task, ensure_repository

    url, _ = web
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session_:
        repo = ensure_repository(session_, 1, "team", "app")
        create_task(session_, repo.id, "issue", issue_number=1, title="issue 1")
    db.dispose()
    bare = requests.post(f"{url}/api/v1/tasks/1/cancel", json={"confirm": True}, timeout=10)
    assert (bare.status_code, bare.json()["error"]["code"]) == (403, "csrf")
    client = session(url)
    for loose in (False, "yes", 1, "true"):  # only a JSON true confirms
        unconfirmed = client.post(f"{url}/api/v1/tasks/1/cancel", json={"confirm": loose})
        assert (unconfirmed.status_code, unconfirmed.json()["error"]["code"]) == (
            400,
            "invalid_input",
        )
    not_failed = client.post(f"{url}/api/v1/tasks/1/retry")
    assert not_failed.status_code == 409  # a conflict with the task's state, named
    assert "only failed or needs_input tasks" in not_failed.json()["error"]["message"]
    assert run_process("--json", "task", "show", "1").json()["state"] == "ready"
    cancelled = client.post(f"{url}/api/v1/tasks/1/cancel", json={"confirm": True})
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "cancelled"
    missing = client.post(f"{url}/api/v1/tasks/99/cancel", json={"confirm": True})
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")


def test_a_task_held_for_a_person_is_resumed_from_the_page(web, upgraded):
    """A step held the task (its repository was archived, say); once a person mended
    that, the operator resumes it from the web as with `task resume`."""
    from aiworker.core.tasks.hold import hold_task
    from aiworker.store.engine import Database
    from aiworker.store.task_records import create_task, ensure_repository

    url, _ = web
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session_:
        repo = ensure_repository(session_, 1, "team", "app")
        task = create_task(session_, repo.id, "issue", issue_number=1, title="issue 1")
        held = (task.id, task.state, task.version)
    assert hold_task(db, *held, "team/app is archived on the forge", "publish")
    db.dispose()
    client = session(url)
    assert requests.post(f"{url}/api/v1/tasks/1/resume", timeout=10).status_code == 403
    resumed = client.post(f"{url}/api/v1/tasks/1/resume")
    assert resumed.status_code == 200, resumed.text
    assert (resumed.json()["state"], resumed.json()["was"]) == ("ready", "paused")
    again = client.post(f"{url}/api/v1/tasks/1/resume")
    assert again.status_code == 409
    assert "only a paused task is resumed" in again.json()["error"]["message"]


def test_start_now_clicked_again_joins_the_tick_it_started(web):
    """A hundred clicks started a hundred ticks at once (4.6 GiB measured); while the
    tick a click started runs, another click joins it (its request stays recorded for
    the next tick), and a new one starts only once it ended."""
    url, _ = web
    client = session(url)
    pids = []
    for _ in range(30):
        answer = client.post(f"{url}/api/v1/actions/start-now", timeout=30)
        assert answer.status_code == 200, answer.text
        pid = answer.json()["pid"]
        if pids and pid != pids[-1]:
            assert not os.path.exists(f"/proc/{pids[-1]}"), "two ticks ran at once"
        pids.append(pid)
    assert len(set(pids)) < len(pids)
