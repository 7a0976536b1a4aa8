"""`providers status` and `providers check` through the command path with scenario windows."""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import run_process
from tests.json_keys import assert_keys


def scenario(path, used, weekly=None, **extra):
    windows = [{"name": "5h", "used_percent": used, "resets_at": "2026-12-01T00:00:00Z"}]
    if weekly is not None:
        windows.append({"name": "week", "used_percent": weekly, "weekly": True})
    path.write_text(json.dumps({"windows": windows, **extra}))
    return path


def configure(tmp_path, monkeypatch, body):
    config = tmp_path / "config.toml"
    config.write_text(body)
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))


def test_status_picks_the_second_provider_when_the_first_is_below_reserve(
    upgraded, tmp_path, monkeypatch
):
    scenario(tmp_path / "codex.json", used=95)
    scenario(tmp_path / "script.json", used=20, weekly=50)
    configure(
        tmp_path,
        monkeypatch,
        """
providers = ["codex", "script"]
reserve_percent = 10
[provider_options.codex]
scenario = "codex.json"
[provider_options.script]
scenario = "script.json"
""",
    )
    result = run_process("--json", "providers", "status")
    assert result.exit_code == 0, result
    report = result.json()
    assert report["phases"] == {
        "planning": "script",
        "implementation": "script",
        "review": "script",
    }
    codex = report["providers"]["codex"]
    assert codex["eligible"]["implementation"] == {
        "eligible": False,
        "reason": "deferred: window 5h headroom 5 is not above its reserve 10",
    }
    script = report["providers"]["script"]
    assert script["eligible"]["implementation"]["eligible"] is True
    assert {w["name"]: w["headroom"] for w in script["windows"]} == {"5h": 80.0, "week": 50.0}
    conn = sqlite3.connect(upgraded)
    rows = conn.execute(
        "select provider, window, used_percent, reason from provider_observations"
        " where provider = 'codex'"
    ).fetchall()
    conn.close()
    assert (
        "codex",
        "5h",
        95.0,
        "deferred: window 5h headroom 5 is not above its reserve 10",
    ) in rows


def test_unavailable_adapters_and_empty_list(upgraded, tmp_path, monkeypatch):
    configure(tmp_path, monkeypatch, 'providers = ["claude"]\n')
    report = run_process("--json", "providers", "status").json()
    assert report["phases"]["implementation"] is None
    # No guest image and no backend chosen: a real CLI would run on this host.
    reason = report["providers"]["claude"]["eligible"]["review"]["reason"]
    assert reason.startswith("claude would run on this host (no guest image is provisioned")
    configure(tmp_path, monkeypatch, 'providers = ["claude"]\n[execution]\nbackend = "local"\n')
    report = run_process("--json", "providers", "status").json()
    assert report["phases"]["implementation"] is None
    reason = report["providers"]["claude"]["eligible"]["review"]["reason"]
    assert reason == "unavailable: no OAuth login in the private config directory"
    configure(tmp_path, monkeypatch, "providers = []\n")
    empty = run_process("--json", "providers", "status").json()
    assert empty["suspended"] is True
    human = run_process("providers", "status")
    assert "inference is suspended" in human.stdout


def test_check_reads_one_provider(upgraded, tmp_path, monkeypatch):
    scenario(tmp_path / "s.json", used=42, admission_error=None)
    configure(tmp_path, monkeypatch, '[provider_options.script]\nscenario = "s.json"\n')
    report = run_process("--json", "providers", "check", "script").json()
    assert_keys("providers check", report)
    reading = report["providers"]["script"]["reading"]
    assert reading["valid"] is True
    assert reading["windows"][0]["used_percent"] == 42
    bad = run_process("--json", "providers", "check", "nonsense")
    assert bad.exit_code == 2
    broken = tmp_path / "s.json"
    broken.write_text("{not json")
    unreadable = run_process("--json", "providers", "check", "script")
    assert unreadable.exit_code == 75  # cannot be read now: a script can wait and retry
    assert unreadable.json()["providers"]["script"]["reading"]["valid"] is False


def test_a_local_server_that_is_down_fails_its_check_and_shows_in_doctor(
    upgraded, tmp_path, monkeypatch
):
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    scenario(tmp_path / "s.json", used=10)
    configure(
        tmp_path,
        monkeypatch,
        f'providers = ["llama", "script"]\n[provider_options.llama]\n'
        f'base_url = "http://127.0.0.1:{port}"\n[provider_options.script]\nscenario = "s.json"\n',
    )
    down = run_process("providers", "check", "llama")
    assert down.exit_code == 75, down
    assert "health answered" in " ".join(down.stdout.split())
    assert run_process("providers", "check", "script").exit_code == 0
    doctor = run_process("--json", "doctor").json()
    checks = {c["name"]: c for c in doctor["checks"]}
    assert checks["provider:script"]["status"] == "ok"
    assert checks["provider:llama"]["status"] == "warn"
    assert "its signal cannot be read: health answered" in checks["provider:llama"]["detail"]
    assert "not admitted until it can be read" in checks["provider:llama"]["detail"]


def test_llama_without_a_base_url_is_unavailable_and_says_why(upgraded, tmp_path, monkeypatch):
    """No guessed port: without provider_options.llama.base_url the provider is
    unavailable, and check, status and doctor name the missing setting."""
    configure(tmp_path, monkeypatch, 'providers = ["llama"]\n')
    check = run_process("providers", "check", "llama")
    assert check.exit_code == 75, check
    why = "provider_options.llama.base_url is not set"
    assert why in " ".join(check.stdout.split())
    status = run_process("--json", "providers", "status").json()
    assert why in status["providers"]["llama"]["reading"]["reason"]
    checks = {c["name"]: c for c in run_process("--json", "doctor").json()["checks"]}
    assert why in checks["provider:llama"]["detail"]


def test_recorded_failures_put_a_provider_into_backoff(upgraded, tmp_path, monkeypatch):
    from aiworker.store.engine import Database
    from aiworker.store.observations import record_run

    scenario(tmp_path / "a.json", used=10)
    configure(
        tmp_path,
        monkeypatch,
        """
providers = ["codex", "script"]
[provider_options.codex]
scenario = "a.json"
[provider_options.script]
scenario = "a.json"
""",
    )
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        record_run(session, "codex", "transient", "503 overloaded")
        record_run(session, "codex", "transient", "503 overloaded")
    db.dispose()
    report = run_process("--json", "providers", "status").json()
    assert report["phases"]["implementation"] == "script"
    reason = report["providers"]["codex"]["eligible"]["implementation"]["reason"]
    assert reason.startswith("backing off after failures until")
    with db.write() as session:
        record_run(session, "codex", "ok", "")
    db.dispose()
    assert (
        run_process("--json", "providers", "status").json()["phases"]["implementation"] == "codex"
    )


def test_llama_serves_only_simple_work(upgraded, tmp_path, monkeypatch):
    configure(tmp_path, monkeypatch, 'providers = ["llama"]\n')
    report = run_process("--json", "providers", "status").json()
    eligible = report["providers"]["llama"]["eligible"]
    assert eligible["planning"]["reason"] == "llama does not serve planning"
    assert eligible["implementation"]["reason"] == (
        "llama serves only simple milestones and minor review fixes"
    )


def test_provider_homes_are_private_and_separate(upgraded, state_dir, tmp_path, monkeypatch):
    shared = tmp_path / "homes"
    shared.mkdir(mode=0o755)
    (shared / "claude").mkdir(mode=0o755)  # made by hand, readable by everyone
    configure(
        tmp_path,
        monkeypatch,
        'providers = ["claude", "codex"]\n[provider_options.claude]\nhome = "homes/claude"\n',
    )
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no codex binary: the reading only fails
    report = run_process("--json", "providers", "status").json()
    assert set(report["providers"]) == {"claude", "codex"}
    assert (shared / "claude").stat().st_mode & 0o777 == 0o700
    assert (state_dir / "providers" / "codex").stat().st_mode & 0o777 == 0o700


def test_a_home_that_holds_the_state_directory_keeps_only_that_provider_out(
    upgraded, state_dir, tmp_path, monkeypatch
):
    """A provider's home is copied for every run: one that holds the state directory
    would copy the live database with plain file reads, which drops the job's own
    SQLite locks, and would copy itself into its copy. That provider is never admitted
    and says why; the next one in the order serves."""
    scenario(tmp_path / "script.json", used=20)
    configure(
        tmp_path,
        monkeypatch,
        'providers = ["claude", "script"]\n[provider_options.claude]\nhome = "."\n'
        '[provider_options.script]\nscenario = "script.json"\n',
    )
    why = (
        f"provider_options.claude.home {tmp_path} holds aiworker's state directory "
        f"({state_dir}); give the provider a home of its own"
    )
    report = run_process("--json", "providers", "status").json()
    assert report["phases"] == dict.fromkeys(("planning", "implementation", "review"), "script")
    claude = report["providers"]["claude"]
    assert claude["reading"]["reason"] == why
    assert claude["eligible"]["implementation"] == {"eligible": False, "reason": why}
    check = run_process("--json", "providers", "check", "claude")
    assert check.exit_code == 75, check
    assert why in check.stdout
    doctor = run_process("--json", "doctor").json()
    [seen] = [c for c in doctor["checks"] if c["name"] == "provider:claude"]
    assert seen["status"] == "warn"
    assert why in seen["detail"]


def test_a_reason_that_looks_like_markup_is_shown_as_text(upgraded, tmp_path, monkeypatch):
    """A reading's reason carries outside text (a path, a CLI's message): square brackets
    in it are shown as they are, never taken for rich markup that fails the rendering."""
    configure(
        tmp_path,
        monkeypatch,
        'providers = ["script"]\n[provider_options.script]\nscenario = "gone[/bold][red].json"\n',
    )
    shown = run_process("providers", "status")
    assert shown.exit_code == 0, shown
    assert "[/bold][red]" in shown.stdout


class _Health(BaseHTTPRequestHandler):
    """A server where a llama-server should be: a page that is not llama's, or a health
    answer that comes a byte at a time and never ends."""

    protocol_version = "HTTP/1.1"
    trickle = False

    def log_message(self, *args):
        return None

    def do_GET(self):
        if not self.trickle:
            page = b"<html>Sign in</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        with contextlib.suppress(OSError):
            for _ in range(100000):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)


@pytest.mark.parametrize(
    ("trickle", "said"),
    [
        (False, 'health answered 200 without {"status": "ok"}'),
        (True, "the answer did not arrive whole within"),
    ],
    ids=["another service", "a byte at a time"],
)
def test_a_health_answer_that_is_not_llamas_is_not_admitted(
    upgraded, tmp_path, monkeypatch, trickle, said
):
    handler = type("Health", (_Health,), {"trickle": trickle})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        configure(
            tmp_path,
            monkeypatch,
            'providers = ["llama"]\n[provider_options.llama]\n'
            f'base_url = "http://127.0.0.1:{server.server_address[1]}"\n',
        )
        started = time.monotonic()
        check = run_process("providers", "check", "llama")
        assert time.monotonic() - started < 60
    finally:
        server.shutdown()
        server.server_close()
    assert check.exit_code == 75, check
    assert said in " ".join(check.stdout.split())
