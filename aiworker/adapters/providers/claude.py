"""Claude Code: `claude -p --output-format stream-json --verbose`; usage windows from the
OAuth usage endpoint through an isolated reader, never an inference call."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import requests

from aiworker.adapters.providers import base
from aiworker.secrets import register_secret

USAGE_URL = "https://api.anthropic.com/api/oauth/usage"
WINDOWS = {"five_hour": False, "seven_day": True, "seven_day_opus": True, "seven_day_sonnet": True}


def reading_from_usage(
    body: dict[str, Any], now: datetime, model: str | None = None
) -> base.Reading:
    """The usage body → windows; model-specific weekly windows apply to their model only;
    defer when extra usage (paid credits) is enabled."""
    windows = []
    for key, weekly in WINDOWS.items():
        value = body.get(key)
        if not isinstance(value, dict) or value.get("utilization") is None:
            continue
        family = key.removeprefix("seven_day_") if key.startswith("seven_day_") else None
        if family and model and family not in model:
            continue
        resets = value.get("resets_at")
        windows.append(
            base.Window(
                key,
                float(value["utilization"]),
                datetime.fromisoformat(resets.replace("Z", "+00:00")) if resets else None,
                weekly,
            )
        )
    extra = body.get("extra_usage") or {}
    blocked = bool(extra.get("is_enabled"))
    return base.Reading(
        "claude",
        "oauth usage",
        now,
        windows=windows,
        blocked=blocked,
        reason="extra usage is enabled: a run could spend paid credits" if blocked else "",
    )


class ClaudeProvider(base.CliProvider):
    name: ClassVar[str] = "claude"
    editable_settings: ClassVar[tuple[str, ...]] = ("enabled", "model", "effort")
    measured_windows: ClassVar[tuple[str, ...]] = ("five_hour", "seven_day")

    def __init__(
        self, config_dir: Path, usage_url: str = USAGE_URL, binary: str = "claude"
    ) -> None:
        self.config_dir = config_dir
        self.usage_url = usage_url
        self.binary = binary

    def _token(self) -> str | None:
        try:
            data = json.loads((self.config_dir / ".credentials.json").read_text())
            token = data["claudeAiOauth"]["accessToken"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        register_secret(str(token))
        return str(token)

    def admission(self, now: datetime, model: str | None = None) -> base.Reading:
        token = self._token()
        if token is None:
            return self.refused(
                "oauth usage", now, "no OAuth login in the private config directory"
            )
        try:
            response = requests.get(
                self.usage_url,
                timeout=10,
                headers={"Authorization": f"Bearer {token}", "anthropic-beta": "oauth-2025-04-20"},
            )
        except requests.RequestException as exc:
            return self.refused(
                "oauth usage", now, f"usage endpoint unreachable: {type(exc).__name__}"
            )
        if response.status_code != 200:
            return self.refused(
                "oauth usage", now, f"usage endpoint answered HTTP {response.status_code}"
            )
        return reading_from_usage(response.json(), now, model)

    def command(self, run: base.RunRequest) -> base.CommandSpec:
        argv = [
            self.binary,
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--permission-mode",
            "bypassPermissions",
            "--no-session-persistence",
            "--strict-mcp-config",
            "--mcp-config",
            '{"mcpServers":{}}',
            "--json-schema",
            run.schema.read_text() if run.schema.exists() else "{}",
        ]
        if run.model:
            argv += ["--model", run.model]
        if run.effort:
            argv += ["--effort", run.effort]
        # HOME is the private config directory itself, never a parent that other
        # providers' homes (and credentials) live under.
        env = base.minimal_env(
            self.config_dir,
            {
                "CLAUDE_CONFIG_DIR": str(self.config_dir),
                "DISABLE_AUTOUPDATER": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "ENABLE_CLAUDEAI_MCP_SERVERS": "false",
            },
        )
        return base.CommandSpec(argv, env, run.prompt.encode())

    def parse(self, stdout: bytes, exit_code: int) -> base.RunOutcome:
        for event in reversed(base.json_lines(stdout)):
            if event.get("type") != "result":
                continue
            usage: dict[str, int] = {}
            for per_model in (event.get("modelUsage") or {}).values():
                for key in ("inputTokens", "outputTokens"):
                    usage[key] = usage.get(key, 0) + int(per_model.get(key, 0))
            if event.get("is_error") or exit_code != 0:
                return base.RunOutcome(
                    None, usage, str(event.get("result") or event.get("subtype"))
                )
            structured = event.get("structured_output")
            document = (
                structured
                if isinstance(structured, dict)
                else base.result_document(str(event.get("result") or ""))
            )
            return base.RunOutcome(document, usage, None if document else "no result document")
        return base.RunOutcome(None, {}, f"no result message (exit {exit_code})")
