"""The provider adapters against what the real CLIs print: output captured from them
(tests/fixtures/providers/captured/, see its README) and, where npm can install them, the
binaries themselves run offline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from aiworker.adapters.providers import codex as codex_module
from aiworker.adapters.providers.base import RunRequest
from aiworker.adapters.providers.claude import ClaudeProvider
from aiworker.adapters.providers.codex import CodexProvider
from aiworker.adapters.providers.opencode import OpenCodeProvider, opencode_command
from aiworker.runtime.processes import converse
from aiworker.runtime.workspace import Workspace, sandboxed

CAPTURED = Path(__file__).resolve().parent / "fixtures" / "providers" / "captured"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def captured(name: str) -> bytes:
    return (CAPTURED / name).read_bytes()


def classified(provider, stdout: bytes, exit_code: int, stderr: bytes = b"") -> tuple[str, str]:
    """What run_provider makes of a finished run: the failure class and its reason."""
    outcome = provider.parse(stdout, exit_code)
    assert outcome.result is None
    message = f"{outcome.error} {stderr.decode(errors='replace')}"
    return provider.classify(message), outcome.error


# codex ----------------------------------------------------------------------------------


def test_codex_reconnect_errors_do_not_fail_a_run_that_completes(tmp_path):
    outcome = CodexProvider(tmp_path).parse(captured("codex_exec_reconnected_then_done.jsonl"), 0)
    assert outcome.error is None
    assert outcome.result == {"completion": "complete", "blockers": []}
    assert outcome.usage["output_tokens"] == 450


@pytest.mark.parametrize(
    ("fixture", "expected", "reason"),
    [
        ("codex_exec_network_down.jsonl", "transient", "Connection failed: error sending request"),
        ("codex_exec_bad_key.jsonl", "auth", "unexpected status 401 Unauthorized"),
    ],
)
def test_codex_terminal_failures_are_classified(tmp_path, fixture, expected, reason):
    kind, error = classified(CodexProvider(tmp_path), captured(fixture), 1)
    assert kind == expected
    assert error.startswith(reason)  # turn.failed's message, not a Reconnecting line


def test_codex_runs_end_on_a_network_outage_instead_of_retrying_for_ever(tmp_path):
    spec = CodexProvider(tmp_path).command(
        RunRequest("implementation", None, None, tmp_path, tmp_path / "schema.json", "x")
    )
    disabled = [spec.argv[i + 1] for i, a in enumerate(spec.argv) if a == "--disable"]
    assert "unbounded_connection_retries" in disabled


FAKE_APP_SERVER = """
import json, os, sys, threading
# Like `codex app-server`: answers initialize at once and the rate-limit read a moment
# later, and exits the instant its input ends, dropping what is still unanswered.
reply = {reply!r}
for line in sys.stdin:
    request = json.loads(line)
    if request.get("id") == 1:
        print(json.dumps({{"id": 1, "result": {{"userAgent": "codex"}}}}), flush=True)
    elif request.get("id") == 2 and reply:
        threading.Timer(0.3, lambda: print(reply, flush=True)).start()
os._exit(0)
"""


def fake_app_server(tmp_path: Path, reply: str) -> str:
    script = tmp_path / "codex"
    script.write_text(f"#!{sys.executable}\n" + FAKE_APP_SERVER.format(reply=reply))
    script.chmod(0o755)
    return str(script)


def test_codex_quota_read_waits_for_the_answer_with_stdin_open(tmp_path):
    no_login = next(
        line
        for line in captured("codex_app_server_no_login.jsonl").decode().splitlines()
        if '"id":2' in line
    )
    reading = CodexProvider(
        tmp_path / "home", binary=fake_app_server(tmp_path, no_login)
    ).admission(NOW)
    assert not reading.valid
    assert reading.reason == "codex account authentication required to read rate limits"


def test_codex_quota_read_gives_up_at_its_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(codex_module, "APP_SERVER_SECONDS", 1)
    reading = CodexProvider(tmp_path / "home", binary=fake_app_server(tmp_path, "")).admission(NOW)
    assert not reading.valid
    assert reading.reason == "no rate-limit answer (timed out)"


def test_a_conversation_leaves_nothing_running(tmp_path):
    marker = f"{70 + os.getpid() % 29}.7"
    script = f"sleep {marker} & echo ready; cat >/dev/null"
    result = converse(
        ["/bin/sh", "-c", script],
        [b"{}"],
        answered=lambda line: line == b"ready",
        env={"PATH": os.environ["PATH"]},
        timeout=10,
    )
    assert (result.returncode, result.stdout) == (0, "ready\n")
    # Killed when the conversation ends; on a loaded machine the kernel may take a moment
    # to take the process out of the table.
    deadline = time.monotonic() + 5
    while True:
        running = subprocess.run(
            ["pgrep", "-f", f"sleep {marker}"], capture_output=True, check=False
        )
        if running.stdout == b"" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert running.stdout == b""


@pytest.mark.slow
def test_real_codex_app_server_says_why_it_cannot_read_limits(bin_dir, tmp_path):
    provider = CodexProvider(tmp_path / "home", binary=str(bin_dir / "codex"))
    missing = provider.admission(NOW)
    assert not missing.valid
    assert missing.reason.startswith("no rate-limit answer (exit 1: CODEX_HOME points to")
    provider.home.mkdir(mode=0o700)
    reading = provider.admission(NOW)
    assert not reading.valid
    assert reading.reason == "codex account authentication required to read rate limits"


# claude ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stdout", "stderr", "expected"),
    [
        ("claude_not_logged_in.jsonl", None, "auth"),
        ("claude_network_down.jsonl", None, "transient"),
        (None, "claude_root_refusal.stderr", "environment"),
    ],
)
def test_claude_failures_are_classified(tmp_path, stdout, stderr, expected):
    out = captured(stdout) if stdout else b""
    err = captured(stderr) if stderr else b""
    kind, _ = classified(ClaudeProvider(tmp_path / ".claude"), out, 1, err)
    assert kind == expected


def test_each_provider_home_is_its_own(tmp_path):
    homes = {name: tmp_path / "providers" / name for name in ("claude", "codex")}
    claude = ClaudeProvider(homes["claude"]).command(
        RunRequest("review", None, None, tmp_path, tmp_path / "s.json", "x")
    )
    codex = CodexProvider(homes["codex"]).command(
        RunRequest("review", None, None, tmp_path, tmp_path / "s.json", "x")
    )
    assert claude.env["HOME"] == claude.env["CLAUDE_CONFIG_DIR"] == str(homes["claude"])
    assert codex.env["HOME"] == codex.env["CODEX_HOME"] == str(homes["codex"])
    # No CLI's HOME contains another provider's home (and so its credentials).
    for spec in (claude, codex):
        home = Path(spec.env["HOME"])
        assert [h for h in homes.values() if h != home and home in h.parents] == []


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal is claude's answer to root")
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_real_claude_runs_unprivileged_inside_the_sandbox(bin_dir, tmp_path):
    """As root, claude refuses to bypass permissions; in the sandbox the run is an
    ordinary user and gets as far as the missing login."""
    workspace = Workspace(tmp_path / "ws")
    workspace.repo.mkdir(parents=True)
    (workspace.home / "tmp").mkdir(parents=True)
    provider = ClaudeProvider(tmp_path / "claude-home", binary=str(bin_dir / "claude"))
    provider.config_dir.mkdir(mode=0o700)
    spec = provider.command(
        RunRequest("review", None, None, workspace.repo, tmp_path / "s.json", "hi")
    )

    def run(argv: list[str]) -> tuple[str, str]:
        done = subprocess.run(
            argv,
            input=spec.stdin,
            capture_output=True,
            env=spec.env,
            cwd=workspace.repo,
            timeout=120,
            check=False,
        )
        return classified(provider, done.stdout, done.returncode, done.stderr)

    assert run(spec.argv)[0] == "environment"
    homes = [provider.config_dir]
    assert run(sandboxed(spec.argv, workspace, homes)) == (
        "auth",
        "Not logged in · Please run /login",
    )


# opencode -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [("opencode_network_down.jsonl", "transient"), ("opencode_bad_key.jsonl", "auth")],
)
def test_opencode_failures_are_classified(fixture, expected):
    kind, _ = classified(OpenCodeProvider(None), captured(fixture), 1)
    assert kind == expected


class _Recorder(BaseHTTPRequestHandler):
    """A stand-in for the paid Anthropic endpoint: records bodies, answers 401."""

    bodies: list[str]

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.bodies.append(self.rfile.read(length).decode(errors="replace"))
        body = json.dumps(
            {
                "type": "error",
                "error": {"type": "authentication_error", "message": "invalid x-api-key"},
            }
        ).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        return None


@pytest.mark.slow
def test_real_opencode_takes_a_large_prompt_on_stdin(bin_dir, tmp_path):
    """The prompt never travels in argv (visible in ps, 128 KiB per string, quoted by
    opencode when it holds spaces): a 200 KiB prompt arrives whole."""
    handler = type("Recorder", (_Recorder,), {"bodies": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        marker = 'Fix "add" so that add(2, 3) == 5.'
        prompt = marker + "\n" + "context line with spaces\n" * 8000
        config = {
            "provider": {
                "anthropic": {"options": {"baseURL": f"http://127.0.0.1:{server.server_port}/v1"}}
            }
        }
        workspace = tmp_path / "repo"
        workspace.mkdir()
        spec = opencode_command(
            tmp_path / "home", "anthropic/claude-sonnet-4-5", workspace, prompt, config
        )
        assert all(marker not in arg for arg in spec.argv)
        argv = [str(bin_dir / "opencode"), *spec.argv[1:]]
        env = {**spec.env, "ANTHROPIC_API_KEY": "sk-ant-fake-000"}
        done = subprocess.run(
            argv, input=spec.stdin, capture_output=True, env=env, timeout=120, check=False
        )
    finally:
        server.shutdown()
        server.server_close()
    sent = [json.loads(b) for b in handler.bodies]
    texts = [
        block.get("text", "")
        for body in sent
        for message in body.get("messages", [])
        for block in (message["content"] if isinstance(message["content"], list) else [])
    ]
    assert any(text.startswith(marker) and len(text) >= len(prompt) - 1 for text in texts)
    kind, error = classified(OpenCodeProvider(None), done.stdout, done.returncode)
    assert kind == "auth"
    assert "HTTP 401" in error


# settings the CLIs would silently ignore -------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "effort", "accepted"),
    [
        ("claude", "minimal", False),  # claude warns "Unknown --effort value" and ignores it
        ("claude", "xhigh", True),
        ("codex", "max", False),
        ("codex", "minimal", True),
        ("opencode", "high", False),  # opencode takes no effort setting
        ("llama", "low", False),
    ],
)
def test_effort_is_checked_against_what_each_cli_accepts(cli, provider, effort, accepted):
    if provider == "claude" and effort == "minimal":
        assert b"Unknown --effort value 'minimal'" in captured("claude_effort_minimal.stderr")
    result = cli("config", "set", f"phases.review.providers.{provider}.effort", effort)
    assert result.exit_code == (0 if accepted else 2), result.stderr
    if not accepted:
        assert provider in result.stderr
        assert effort in result.stderr
    shown = cli("--json", "config", "show").json()
    stored = (shown["config"]["phases"]["review"]["providers"].get(provider) or {}).get("effort")
    assert stored == (effort if accepted else None)
