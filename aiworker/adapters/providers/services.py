"""Kimi, DeepSeek, OpenCode and a local llama.cpp server: admission signals and failures.

Kimi has synthetic headroom (its login and model are verified; exhaustion shows up
as rate-limit errors at run time). DeepSeek needs an explicitly enabled paid key
and a usable balance (synthetic 100%). OpenCode is opt-in behind a verified
zero-spend budget guard. llama.cpp needs a healthy server with a free slot and
serves only simple milestones and minor review fixes.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import requests

from aiworker.adapters.providers.base import (
    PHASES,
    CommandSpec,
    Reading,
    RunOutcome,
    Window,
    classify_text,
    json_lines,
    minimal_env,
    result_document,
)
from aiworker.secrets import register_secret

GUARD_FIELDS = (
    "account",
    "cli_version",
    "adapter",
    "zero_spend_verified",
    "budget_usd",
    "evidence",
)


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    try:
        response = requests.get(url, headers=headers or {}, timeout=10)
    except requests.RequestException as exc:
        return 0, type(exc).__name__
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, None


class KimiProvider:
    name: ClassVar[str] = "kimi"
    phases: ClassVar[tuple[str, ...]] = PHASES
    measured_windows: ClassVar[tuple[str, ...]] = ()

    def __init__(self, home: Path, model: str | None) -> None:
        self.home = home
        self.model = model

    def admission(self, now: datetime) -> Reading:
        try:
            credentials = json.loads((self.home / "credentials" / "kimi-code.json").read_text())
        except (OSError, ValueError):
            return Reading(
                self.name,
                "kimi login",
                now,
                valid=False,
                reason="no Kimi Code login in the private home",
            )
        if not isinstance(credentials, dict) or not credentials.get("access_token"):
            return Reading(self.name, "kimi login", now, valid=False, reason="login has no token")
        register_secret(str(credentials["access_token"]))
        if not self.model:
            return Reading(
                self.name, "kimi login", now, valid=False, reason="no model selected for kimi"
            )
        return Reading(
            self.name, "kimi login (synthetic headroom)", now, windows=[Window("synthetic", 0.0)]
        )

    def classify(self, failure: str) -> str:
        lowered = failure.lower()
        if "exceeded_current_quota" in lowered or "insufficient_quota" in lowered:
            return "quota_exhausted"
        return classify_text(failure)


class DeepSeekProvider:
    name: ClassVar[str] = "deepseek"
    phases: ClassVar[tuple[str, ...]] = PHASES
    measured_windows: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, api_key: str | None, paid_enabled: bool, base_url: str = "https://api.deepseek.com"
    ) -> None:
        self.api_key = api_key
        self.paid_enabled = paid_enabled
        self.base_url = base_url.rstrip("/")
        if api_key:
            register_secret(api_key)

    def admission(self, now: datetime) -> Reading:
        if not self.paid_enabled:
            return Reading(
                self.name,
                "config",
                now,
                valid=False,
                reason="the paid key is not enabled (provider_options.deepseek.paid_enabled)",
            )
        if not self.api_key:
            return Reading(
                self.name, "config", now, valid=False, reason="DEEPSEEK_API_KEY is not set"
            )
        status, body = _get(
            f"{self.base_url}/user/balance", {"Authorization": f"Bearer {self.api_key}"}
        )
        if status != 200 or not isinstance(body, dict):
            return Reading(
                self.name,
                "/user/balance",
                now,
                valid=False,
                reason=f"balance unavailable (HTTP {status})",
            )
        if not body.get("is_available"):
            return Reading(
                self.name, "/user/balance", now, valid=False, reason="insufficient balance"
            )
        return Reading(
            self.name, "/user/balance (synthetic 100%)", now, windows=[Window("balance", 0.0)]
        )

    def classify(self, failure: str) -> str:
        return classify_text(failure)


class OpenCodeProvider:
    name: ClassVar[str] = "opencode"
    phases: ClassVar[tuple[str, ...]] = PHASES
    measured_windows: ClassVar[tuple[str, ...]] = ()

    def __init__(self, guard: Path | None) -> None:
        self.guard = guard

    def admission(self, now: datetime) -> Reading:
        if self.guard is None:
            return Reading(
                self.name,
                "budget guard",
                now,
                valid=False,
                reason="opt-in: no zero-spend budget guard is configured",
            )
        try:
            guard = json.loads(self.guard.read_text())
        except (OSError, ValueError):
            return Reading(
                self.name,
                "budget guard",
                now,
                valid=False,
                reason=f"budget guard {self.guard} is absent or unreadable",
            )
        missing = [f for f in GUARD_FIELDS if not isinstance(guard, dict) or f not in guard]
        if missing:
            return Reading(
                self.name,
                "budget guard",
                now,
                valid=False,
                reason=f"budget guard lacks {', '.join(missing)}",
            )
        if guard["zero_spend_verified"] is not True or float(guard["budget_usd"]) != 0.0:
            return Reading(
                self.name,
                "budget guard",
                now,
                valid=False,
                reason="budget guard does not verify zero spend",
            )
        windows = [
            Window(str(w["name"]), float(w["used_percent"]), weekly=bool(w.get("weekly")))
            for w in guard.get("windows", [])
        ]
        return Reading(self.name, f"budget guard ({guard['adapter']})", now, windows=windows)

    def classify(self, failure: str) -> str:
        return classify_text(failure)


class LlamaProvider:
    name: ClassVar[str] = "llama"
    # Only simple milestones and minor review fixes, one local try per snapshot.
    phases: ClassVar[tuple[str, ...]] = ("implementation", "review")
    measured_windows: ClassVar[tuple[str, ...]] = ()
    simple_only: ClassVar[bool] = True

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def admission(self, now: datetime) -> Reading:
        status, body = _get(f"{self.base_url}/health")
        if status != 200:
            reason = "loading the model" if status == 503 else f"health answered {status or body}"
            return Reading(self.name, "/health", now, valid=False, reason=reason)
        status, _ = _get(f"{self.base_url}/slots?fail_on_no_slot=1")
        if status == 503:
            return Reading(self.name, "/slots", now, valid=False, reason="no free slot")
        props_status, props = _get(f"{self.base_url}/props")
        slots = (
            props.get("total_slots") if props_status == 200 and isinstance(props, dict) else None
        )
        return Reading(
            self.name,
            f"/health, /slots ({slots or '?'} slots)",
            now,
            windows=[Window("local", 0.0)],
        )

    def classify(self, failure: str) -> str:
        return classify_text(failure)


def kimi_command(home: Path, model: str | None, prompt: str) -> CommandSpec:
    """`kimi -p PROMPT --output-format stream-json` (prompt by argv only), private home."""
    argv = ["kimi", "-p", prompt, "--output-format", "stream-json"]
    if model:
        argv += ["-m", model]
    env = minimal_env(home, {"KIMI_CODE_HOME": str(home), "KIMI_DISABLE_TELEMETRY": "1"})
    return CommandSpec(argv, env)


def kimi_parse(stdout: bytes, exit_code: int) -> RunOutcome:
    final = ""
    for event in json_lines(stdout):
        if event.get("role") == "assistant" and isinstance(event.get("content"), str):
            final = event["content"]
    if exit_code != 0:
        return RunOutcome(None, {}, f"kimi exited {exit_code}")
    document = result_document(final)
    return RunOutcome(document, {}, None if document else "no result document")


def opencode_command(
    home: Path,
    model: str | None,
    workspace: Path,
    prompt: str,
    config_content: dict[str, Any] | None = None,
) -> CommandSpec:
    """`opencode run --format json`, auto-approving inside the disposable workspace."""
    argv = ["opencode", "run", "--format", "json", "--auto", "--pure", "--dir", str(workspace)]
    if model:
        argv += ["-m", model]
    argv.append(prompt)
    extra = {
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    }
    if config_content is not None:
        extra["OPENCODE_CONFIG_CONTENT"] = json.dumps(config_content)
    return CommandSpec(argv, minimal_env(home, extra))


def opencode_parse(stdout: bytes, exit_code: int) -> RunOutcome:
    final = ""
    usage: dict[str, int] = {}
    error = None
    for event in json_lines(stdout):
        part = event.get("part") or {}
        if event.get("type") == "text" and isinstance(part, dict):
            final = str(part.get("text", ""))
        elif event.get("type") == "step_finish" and isinstance(part, dict):
            for key, value in (part.get("tokens") or {}).items():
                if isinstance(value, int):
                    usage[key] = usage.get(key, 0) + value
        elif event.get("type") == "error":
            detail = event.get("error") or {}
            error = str((detail.get("data") or {}).get("message") or detail.get("name"))
    if exit_code != 0 or error:
        return RunOutcome(None, usage, error or f"opencode exited {exit_code}")
    document = result_document(final)
    return RunOutcome(document, usage, None if document else "no result document")


def llama_opencode_config(base_url: str, model: str) -> dict[str, Any]:
    """OpenCode's provider block for a llama.cpp server (its OpenAI-compatible API)."""
    return {
        "provider": {
            "llamacpp": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "llama.cpp",
                "options": {"baseURL": f"{base_url.rstrip('/')}/v1", "apiKey": "local"},
                "models": {model: {"tools": True}},
            }
        },
        "model": f"llamacpp/{model}",
    }
