"""Each provider's quota reader and run parser against recorded outputs in the reference shapes."""

from __future__ import annotations

import json
import sys
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiworker.adapters.providers.base import RunRequest, classify_text
from aiworker.adapters.providers.claude import ClaudeProvider, reading_from_usage
from aiworker.adapters.providers.codex import CodexProvider, reading_from_rate_limits
from aiworker.adapters.providers.deepseek import DeepSeekProvider
from aiworker.adapters.providers.kimi import KimiProvider
from aiworker.adapters.providers.llama import LlamaProvider
from aiworker.adapters.providers.opencode import OpenCodeProvider
from aiworker.config.models import Config, LocalBounds
from aiworker.core.providers.admission import evaluate

FIXTURES = Path(__file__).parent / "fixtures" / "providers"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.fixture
def http():
    """A loopback server answering recorded bodies: routes[path] = (status, body)."""
    servers = []

    def start(routes):
        seen = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                return None

            def do_GET(self):
                seen.append((self.path, dict(self.headers)))
                status, body = routes.get(self.path, (404, {"error": "no"}))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", seen

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_codex_rate_limits_become_windows():
    result = json.loads(fixture("codex_rate_limits.json"))["result"]
    reading = reading_from_rate_limits(result, NOW)
    assert [(w.name, w.used_percent, w.weekly) for w in reading.windows] == [
        ("5h", 37.0, False),
        ("weekly", 81.0, True),
    ]
    assert reading.windows[0].resets_at == datetime.fromtimestamp(1796040000, UTC)
    assert reading.blocked is False
    assert evaluate(reading, 0, Config(), NOW, ("5h", "weekly")).eligible


def test_codex_reached_limit_with_credits_defers():
    result = json.loads(fixture("codex_limit_reached.json"))["result"]
    reading = reading_from_rate_limits(result, NOW)
    assert reading.blocked
    assert "paid credits" in reading.reason
    assert not evaluate(reading, 0, Config(), NOW, ("5h", "weekly")).eligible


def test_codex_admission_talks_json_rpc_to_app_server(tmp_path):
    binary = tmp_path / "codex"
    binary.write_text(
        f"#!/bin/sh\nFAKE_CODEX_REPLY={FIXTURES / 'codex_rate_limits.json'} "
        f'exec {sys.executable} {FIXTURES / "fake_codex.py"} "$@"\n'
    )
    binary.chmod(0o755)
    reading = CodexProvider(tmp_path / "home", binary=str(binary)).admission(NOW)
    assert reading.valid, reading.reason
    assert [w.name for w in reading.windows] == ["5h", "weekly"]
    missing = CodexProvider(tmp_path / "home", binary=str(tmp_path / "nope")).admission(NOW)
    assert not missing.valid


def test_codex_run_output_is_parsed_and_quota_failures_classified(tmp_path):
    provider = CodexProvider(tmp_path)
    outcome = provider.parse(fixture("codex_exec.jsonl"), 0)
    assert outcome.result == {"completion": "complete", "blockers": []}
    assert outcome.usage == {"input_tokens": 1200, "cached_input_tokens": 300, "output_tokens": 450}
    failed = provider.parse(fixture("codex_quota.jsonl"), 1)
    assert failed.result is None
    assert provider.classify(failed.error) == "quota_exhausted"
    spec = provider.command(
        RunRequest(
            "implementation",
            "gpt-5-codex",
            "high",
            tmp_path / "ws",
            tmp_path / "schema.json",
            "do it",
        )
    )
    assert spec.argv[:2] == ["codex", "exec"]
    assert spec.env["CODEX_HOME"] == str(tmp_path)
    assert "OPENAI_API_KEY" not in spec.env


def test_claude_usage_windows_model_specific_and_extra_usage():
    body = json.loads(fixture("claude_usage.json"))
    opus = reading_from_usage(body, NOW, model="claude-opus-4")
    assert [w.name for w in opus.windows] == ["five_hour", "seven_day", "seven_day_opus"]
    assert not evaluate(opus, 0, Config(), NOW).eligible  # opus weekly at 95 %
    sonnet = reading_from_usage(body, NOW, model="claude-sonnet-4")
    assert [w.name for w in sonnet.windows] == ["five_hour", "seven_day"]
    assert evaluate(sonnet, 0, Config(), NOW).eligible
    body["extra_usage"]["is_enabled"] = True
    assert reading_from_usage(body, NOW).blocked


def test_claude_reader_uses_the_private_oauth_token(tmp_path, http):
    url, seen = http({"/api/oauth/usage": (200, json.loads(fixture("claude_usage.json")))})
    config_dir = tmp_path / ".claude"
    config_dir.mkdir()
    (config_dir / ".credentials.json").write_text(
        json.dumps({"claudeAiOauth": {"accessToken": "oauth-canary-123456"}})
    )
    provider = ClaudeProvider(config_dir, usage_url=f"{url}/api/oauth/usage")
    reading = provider.admission(NOW)
    assert reading.valid
    assert seen[0][1]["Authorization"] == "Bearer oauth-canary-123456"
    assert seen[0][1]["anthropic-beta"] == "oauth-2025-04-20"
    assert not ClaudeProvider(tmp_path / "none", usage_url=url).admission(NOW).valid


def test_claude_stream_json_result_and_limit():
    provider = ClaudeProvider(Path("/nonexistent"))
    outcome = provider.parse(fixture("claude_stream.jsonl"), 0)
    assert outcome.result == {"completion": "complete", "blockers": []}
    assert outcome.usage == {"inputTokens": 800, "outputTokens": 200}
    limited = provider.parse(fixture("claude_limit.jsonl"), 1)
    assert provider.classify(limited.error) == "quota_exhausted"


def test_kimi_needs_a_login_and_a_model(tmp_path):
    assert not KimiProvider(tmp_path, "kimi-k2").admission(NOW).valid
    (tmp_path / "credentials").mkdir()
    (tmp_path / "credentials" / "kimi-code.json").write_text(
        json.dumps({"access_token": "kimi-token-abcdef", "refresh_token": "r"})
    )
    assert not KimiProvider(tmp_path, None).admission(NOW).valid
    reading = KimiProvider(tmp_path, "kimi-k2").admission(NOW)
    assert reading.valid
    assert evaluate(reading, 0, Config(), NOW).eligible
    assert (
        KimiProvider(tmp_path, "k").classify("429 exceeded_current_quota_error: quota")
        == "quota_exhausted"
    )


def test_deepseek_needs_an_enabled_key_and_a_usable_balance(http):
    url, seen = http(
        {
            "/user/balance": (
                200,
                {
                    "is_available": True,
                    "balance_infos": [
                        {
                            "currency": "USD",
                            "total_balance": "5.00",
                            "granted_balance": "0",
                            "topped_up_balance": "5.00",
                        }
                    ],
                },
            )
        }
    )
    assert "not enabled" in DeepSeekProvider("sk-canary-1234", False, url).admission(NOW).reason
    reading = DeepSeekProvider("sk-canary-1234", True, url).admission(NOW)
    assert reading.valid
    assert seen[-1][1]["Authorization"] == "Bearer sk-canary-1234"
    empty, _ = http({"/user/balance": (200, {"is_available": False, "balance_infos": []})})
    assert (
        DeepSeekProvider("sk-canary-1234", True, empty).admission(NOW).reason
        == "insufficient balance"
    )
    assert classify_text("402 Insufficient Balance") == "quota_exhausted"
    asked = len(seen)
    # A key no HTTP header can carry (a pasted non-ASCII character): refused by name,
    # never sent, never shown.
    odd = DeepSeekProvider("sk-canary-1234\u2603", True, url).admission(NOW)
    assert not odd.valid
    assert odd.reason == (
        "the API key is malformed: expected one token of printable ASCII characters, no spaces"
    )
    assert len(seen) == asked


def test_opencode_is_opt_in_behind_a_zero_spend_guard(tmp_path):
    assert not OpenCodeProvider(None).admission(NOW).valid
    guard = tmp_path / "guard.json"
    assert "absent" in OpenCodeProvider(guard).admission(NOW).reason
    document = {
        "account": "team",
        "cli_version": "1.18.33",
        "adapter": "opencode-v1",
        "zero_spend_verified": True,
        "budget_usd": 0,
        "evidence": "run 2026-11-29",
        "windows": [{"name": "daily", "used_percent": 12}],
    }
    guard.write_text(json.dumps(document))
    reading = OpenCodeProvider(guard).admission(NOW)
    assert reading.valid
    assert reading.windows[0].name == "daily"
    guard.write_text(json.dumps({**document, "budget_usd": 5}))
    assert "zero spend" in OpenCodeProvider(guard).admission(NOW).reason


def test_llama_needs_health_and_a_free_slot(http):
    loading, _ = http({"/health": (503, {"error": {"code": 503, "message": "Loading model"}})})
    assert LlamaProvider(loading, 200, LocalBounds()).admission(NOW).reason == "loading the model"
    busy, _ = http(
        {
            "/health": (200, {"status": "ok"}),
            "/slots?fail_on_no_slot=1": (503, {"error": "no slot"}),
        }
    )
    assert LlamaProvider(busy, 200, LocalBounds()).admission(NOW).reason == "no free slot"
    ready, _ = http(
        {
            "/health": (200, {"status": "ok"}),
            "/slots?fail_on_no_slot=1": (200, []),
            "/props": (200, {"total_slots": 2}),
        }
    )
    reading = LlamaProvider(ready, 200, LocalBounds()).admission(NOW)
    assert reading.valid
    assert "2 slots" in reading.source
    assert LlamaProvider.phases == ("implementation", "review")


# An outage's stderr as CLIs print it: timestamps, request ids and tokens are full of
# digits; a status code counts only where it stands as one.
@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("2026-12-02T12:40:21.402Z ERROR stream disconnected before completion", "transient"),
        ("request 5a402b1c-0401-4503 failed: stream error; retrying", "other"),
        ("Error: unexpected status 503 Service Unavailable", "transient"),
        ("error: 402 Payment Required", "quota_exhausted"),
        ("HTTP/1.1 401 Unauthorized", "auth"),
        ("API Error (401): invalid credentials", "auth"),
        ("reconnecting... 2/5 (elapsed 0:00:12.401)", "other"),
        ("model v1.503.2 unavailable: capacity", "transient"),
    ],
)
def test_status_codes_count_only_where_they_stand_alone(line, expected):
    assert classify_text(line) == expected


@given(st.text(alphabet="0123456789abcdef", min_size=8, max_size=64))
def test_a_token_or_id_in_the_output_never_reads_as_quota_or_auth(token):
    assert classify_text(f"stream error for request {token}") == "other"
