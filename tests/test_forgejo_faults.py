"""The adapter against a misbehaving server on loopback: retries, Retry-After, no token leaks."""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest

from aiworker.adapters.forgejo import ForgejoClient, ForgeUnavailable, transport
from aiworker.adapters.forgejo.errors import (
    ForgeAnswerLost,
    ForgeBadAnswer,
    ForgeError,
    ForgeInvalid,
    ForgeNotFound,
    ForgeUnreachable,
)
from tests.fake_forge import USER

CANARY = "canary-forge-token-5d1e9a0b7c"


def client(url, **options):
    options.setdefault("backoff_base", 0.01)
    return ForgejoClient(url, CANARY, timeout=5, **options)


def test_retries_503_then_succeeds(fake):
    script, url = fake(("json", 503, {"message": "busy"}, {}), ("json", 502, {}, {}))
    assert client(url).current_user().login == "bot"
    assert len(script.seen) == 3
    assert all(auth == f"token {CANARY}" for _, _, auth in script.seen)


def test_retries_a_dropped_connection_then_succeeds(fake):
    script, url = fake(("drop",))
    assert client(url).current_user().login == "bot"
    assert len(script.seen) == 2


@pytest.mark.parametrize(("status", "error"), [(404, ForgeNotFound), (422, ForgeInvalid)])
def test_never_retries_other_client_errors(fake, status, error):
    script, url = fake(("json", status, {"message": "no", "url": ""}, {}))
    with pytest.raises(error) as caught:
        client(url).current_user()
    assert caught.value.status == status
    assert caught.value.method == "GET"
    assert caught.value.path == "/api/v1/user"
    assert len(script.seen) == 1


COMMENT = {
    "id": 7,
    "body": "hello",
    "user": USER,
    "created_at": "2026-12-05T10:00:00Z",
    "updated_at": "2026-12-05T10:00:00Z",
}


LOST = [("json", 504, {}, {}), ("json", 502, {}, {}), ("json", 500, {}, {}), ("drop",)]


@pytest.mark.parametrize("lost", LOST)
def test_a_change_whose_answer_was_lost_is_looked_for_before_it_is_made_again(fake, lost):
    """A proxy's 504 (or a 500, 502, or a connection lost after the request went out) may
    come after the forge made the comment: it is looked for, and the one made is taken;
    only one not made is sent again."""
    script, url = fake(lost, ("json", 200, [COMMENT], {}))
    assert client(url).create_comment("team", "app", 1, "hello").id == 7
    assert [(path.rsplit("/", 1)[1]) for _, path, _ in script.seen] == ["comments"] * 2
    script, url = fake(lost, ("json", 200, [], {}), ("json", 201, COMMENT, {}))
    assert client(url).create_comment("team", "app", 1, "hello").id == 7
    assert len(script.seen) == 3  # sent, looked for and not found, sent again


@pytest.mark.parametrize("lost", LOST)
def test_a_change_is_not_sent_twice_by_the_transport(fake, lost):
    script, url = fake(lost)
    with pytest.raises(ForgeAnswerLost) as caught:
        client(url).http.request("POST", "/repos/team/app/pulls", json={}, ok=(201,))
    assert caught.value.exit_code == 75
    assert "the forge may have acted on it before its answer was lost" in str(caught.value)
    assert len(script.seen) == 1


def test_a_change_the_forge_did_not_take_is_sent_again(fake):
    """429 and 503 say the request was not taken; a refused connection never reached it."""
    script, url = fake(
        ("json", 503, {"message": "busy"}, {}),
        ("json", 429, {}, {}),
        ("json", 201, COMMENT, {}),
    )
    assert client(url).create_comment("team", "app", 1, "hello").id == 7
    assert len(script.seen) == 3
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{unused.getsockname()[1]}"
    waits = []
    with pytest.raises(ForgeUnavailable) as caught:
        client(nobody, attempts=3, sleep=waits.append).create_comment("team", "app", 1, "x")
    assert "connection refused" in str(caught.value)
    assert len(waits) == 2


def test_retry_after_is_honoured(fake):
    script, url = fake(("json", 429, {"message": "slow down"}, {"Retry-After": "1"}))
    waits = []
    assert client(url, sleep=lambda s: (waits.append(s), time.sleep(s))).current_user()
    assert waits
    assert waits[0] >= 1.0
    (first, _, _), (second, _, _) = script.seen
    assert second - first >= 1.0


def test_a_retry_after_longer_than_a_try_waits_ends_the_call_at_once(fake):
    """Never sooner than the forge asks: a wait of an hour is not cut to 30 s and tried
    four more times; the call ends now, saying when the forge asked to be asked again."""
    script, url = fake(("json", 503, {"message": "maintenance"}, {"Retry-After": "3600"}))
    waits = []
    with pytest.raises(ForgeUnavailable) as caught:
        client(url, sleep=waits.append).current_user()
    assert "maintenance; it asks to be asked again in 3600 s (Retry-After)" in str(caught.value)
    assert caught.value.exit_code == 75
    assert (len(script.seen), waits) == (1, [])


def test_gives_up_after_the_attempts_with_an_unavailable_error(fake):
    script, url = fake(*[("json", 500, {"message": f"broken {CANARY}"}, {})] * 3)
    with pytest.raises(ForgeUnavailable) as caught:
        client(url, attempts=3).current_user()
    assert caught.value.exit_code == 75
    assert len(script.seen) == 3


def test_canary_token_never_in_errors_or_logs(fake, caplog):
    caplog.set_level(logging.DEBUG, logger="aiworker")
    _script, url = fake(
        ("drop",),
        ("json", 500, {}, {}),
        ("json", 404, {"message": f"no user for token {CANARY}", "url": ""}, {}),
    )
    with pytest.raises(ForgeNotFound) as caught:
        client(url).current_user()
    texts = [str(caught.value), repr(caught.value), caught.value.message, caplog.text]
    assert caplog.records
    assert all(CANARY not in text for text in texts)
    assert "***" in str(caught.value)


def poll_against(cli, tmp_path, monkeypatch, url):
    """`aiworker poll` with every identity pointed at URL, as an operator would run it."""
    monkeypatch.setenv("AIWORKER_TEST_TOKEN", CANARY)
    config = tmp_path / "forge.toml"
    config.write_text(
        f'[forge]\nurl = "{url}"\ntimeout_seconds = 5\n'
        '[forge.identities.worker]\ntoken_env = "AIWORKER_TEST_TOKEN"\n'
        '[[repositories]]\nindex = 1\nowner = "team"\nname = "app"\n'
    )
    result = cli("--config", str(config), "poll")
    assert CANARY not in result.stdout + result.stderr
    return result


def test_a_refused_connection_names_the_url_and_waits_for_the_forge(
    cli, upgraded, tmp_path, monkeypatch
):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    result = poll_against(cli, tmp_path, monkeypatch, f"http://127.0.0.1:{port}")
    assert result.exit_code == 75, result
    assert f"http://127.0.0.1:{port}" in result.stderr
    assert "connection refused" in result.stderr


def test_an_unknown_host_name_needs_the_operator(cli, upgraded, tmp_path, monkeypatch):
    # .invalid never resolves (RFC 2606).
    result = poll_against(cli, tmp_path, monkeypatch, "http://forge.example.invalid")
    assert result.exit_code == 2, result
    assert "http://forge.example.invalid" in result.stderr
    assert "does not resolve (DNS)" in result.stderr


def test_a_503_names_the_url_and_forgejos_message(cli, upgraded, tmp_path, monkeypatch, fake):
    _script, url = fake(*[("json", 503, {"message": "under maintenance"}, {})] * 10)
    result = poll_against(cli, tmp_path, monkeypatch, url)
    assert result.exit_code == 75, result
    assert url in result.stderr
    assert "HTTP 503: under maintenance" in result.stderr


def test_an_answer_that_trickles_in_ends_at_its_deadline(fake):
    """A byte every 0.2 s never trips the timeout of a read (2 s): the whole answer has
    four of them."""
    _, url = fake(("trickle", 200, b" " * 200 + json.dumps(USER).encode(), {}))
    started = time.monotonic()
    with pytest.raises(ForgeUnavailable) as caught:
        ForgejoClient(url, CANARY, timeout=2, attempts=1).current_user()
    assert "the answer did not arrive whole within 8 s" in str(caught.value)
    assert caught.value.exit_code == 75
    assert time.monotonic() - started < 30


def test_an_answer_too_large_is_refused(fake, monkeypatch):
    monkeypatch.setattr(transport, "MAX_ANSWER_BYTES", 1000)
    _, url = fake(("raw", 200, b"[" + b" " * 5000 + b"]", {}))
    with pytest.raises(ForgeError, match="the answer is larger than 1000 bytes"):
        client(url).current_user()


def test_a_change_the_forge_redirects_is_not_sent_on_as_a_read(fake):
    """requests sends a POST that gets a 301 or 302 on as a GET: the comment would not
    be made, and the GET's answer taken for it."""
    script, url = fake(("json", 301, {}, {"Location": "/api/v1/elsewhere"}))
    with pytest.raises(ForgeUnreachable) as caught:
        client(url).create_comment("team", "app", 1, "hello")
    assert "the forge redirects POST to" in str(caught.value)
    assert caught.value.exit_code == 2
    assert len(script.seen) == 1


def test_a_listing_that_never_ends_is_refused(fake):
    settings = ("json", 200, {"max_response_items": 2}, {})
    label = {"id": 1, "name": "bug"}
    again = (
        "json",
        200,
        [label, label],
        {"Link": '</api/v1/repos/team/app/labels?page=2>; rel="next"'},
    )
    script, url = fake(settings, again, again, again)
    with pytest.raises(ForgeError, match="the listing does not end"):
        client(url).repo_labels("team", "app")
    assert len(script.seen) == 3  # the settings, the first page, the page that repeats


def test_a_listing_that_changes_while_it_is_read_is_read_again(fake):
    """An item closed between two pages shifts the rest up a place: the one that moved
    onto the page already read would be missed. The total changed, so the listing is read
    again from its first page."""
    settings = ("json", 200, {"max_response_items": 2}, {})
    label = [{"id": n, "name": f"l{n}"} for n in range(4)]
    nxt = '</api/v1/repos/team/app/labels?page=2&limit=2>; rel="next"'
    script, url = fake(
        settings,
        ("json", 200, label[1:3], {"X-Total-Count": "3", "Link": nxt}),
        ("json", 200, [], {"X-Total-Count": "2"}),  # label 1 went: label 3 moved to page 1
        ("json", 200, [label[2], label[3]], {"X-Total-Count": "2", "Link": nxt}),
        ("json", 200, [], {"X-Total-Count": "2"}),
    )
    assert [item.id for item in client(url).repo_labels("team", "app")] == [2, 3]
    assert len(script.seen) == 5


@pytest.mark.parametrize(
    "link",
    [
        "https://git.example.org/forgejo/api/v1/repos/team/app/labels?page=2&limit=2",
        "/forgejo/api/v1/repos/team/app/labels?page=2&limit=2",
    ],
    ids=["another host", "another path"],
)
def test_the_next_page_is_asked_of_the_configured_address(fake, link):
    """Forgejo builds Link from its ROOT_URL (its public name, under a sub-path), which
    is not always the address aiworker is given: the next page is asked of that one."""
    settings = ("json", 200, {"max_response_items": 2}, {})
    first = ("json", 200, [{"id": 1, "name": "bug"}] * 2, {"Link": f'<{link}>; rel="next"'})
    last = ("json", 200, [{"id": 3, "name": "docs"}], {})
    script, url = fake(settings, first, last)
    assert [label.id for label in client(url).repo_labels("team", "app")] == [1, 1, 3]
    assert script.seen[2][1] == "/api/v1/repos/team/app/labels?page=2&limit=2"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"<html>Sign in</html>", "the answer is not a User: not JSON"),
        (json.dumps({**USER, "login": None}).encode(), "the answer is not a User: login: "),
        (b"[" * 100_000 + b"]" * 100_000, "the answer is not a User: "),
    ],
    ids=["a proxy's page", "a wrong type", "deep nesting"],
)
def test_an_answer_that_is_not_what_the_api_says_is_named(fake, body, said):
    _, url = fake(("raw", 200, body, {"Content-Type": "application/json"}))
    with pytest.raises(ForgeBadAnswer) as caught:
        client(url).current_user()
    assert said in str(caught.value)
    assert "GET /user" in str(caught.value)


def test_a_compressed_answer_is_refused_and_a_read_follows_only_the_forges_redirects(fake):
    """Answers are asked for as they are: a compressed one could trickle in empty blocks
    that no read's deadline sees. A read follows a redirect on the forge's own address,
    reading each answer on the way within the bounds; one to elsewhere is refused."""
    gzip = ("raw", 200, b"\x1f\x8b\x08\x00\x00\x00\x00\x00", {"Content-Encoding": "gzip"})
    script, url = fake(gzip)
    with pytest.raises(ForgeError, match="the answer is gzip-encoded"):
        client(url).current_user()
    assert script.seen[0][1] == "/api/v1/user"
    moved = ("json", 302, {}, {"Location": "/api/v1/user?moved=1"})
    script, url = fake(moved)
    assert client(url).current_user().login == "bot"
    assert [path for _, path, _ in script.seen] == ["/api/v1/user", "/api/v1/user?moved=1"]
    _, elsewhere = fake()
    away = ("json", 302, {}, {"Location": f"{elsewhere}/api/v1/user"})
    _, url = fake(away)
    with pytest.raises(ForgeUnreachable, match="the forge redirects GET to"):
        client(url).current_user()


def test_the_clone_url_carries_no_password_of_forge_url(fake):
    """git's remote is on its command line, which every local user can read."""
    repo = {"id": 1, "name": "app", "full_name": "team/app", "owner": USER, "default_branch": "m"}
    _, url = fake(("json", 200, repo, {}))
    with_password = url.replace("http://", f"http://bot:{CANARY}@") + "/sub"
    found = ForgejoClient(with_password, CANARY, timeout=5).repository("team", "app")
    assert found.clone_url == f"{url}/sub/team/app.git"
