"""The adapter against a misbehaving server on loopback: retries, Retry-After, no token leaks."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from aiworker.adapters.forgejo import ForgejoClient, ForgeUnavailable
from aiworker.adapters.forgejo.errors import ForgeInvalid, ForgeNotFound

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


def test_retry_after_is_honoured(fake):
    script, url = fake(("json", 429, {"message": "slow down"}, {"Retry-After": "1"}))
    waits = []
    assert client(url, sleep=lambda s: (waits.append(s), time.sleep(s))).current_user()
    assert waits
    assert waits[0] >= 1.0
    (first, _, _), (second, _, _) = script.seen
    assert second - first >= 1.0


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
