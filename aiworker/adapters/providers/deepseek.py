"""DeepSeek: an explicitly enabled paid key and a usable balance (synthetic 100%); runs
through Claude Code against DeepSeek's Anthropic-compatible API."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import ClassVar

from aiworker.adapters.providers import base
from aiworker.secrets import TOKEN, TOKEN_RULE, register_secret


class DeepSeekProvider(base.CliProvider):
    name: ClassVar[str] = "deepseek"
    editable_settings: ClassVar[tuple[str, ...]] = ("enabled", "model", "effort")

    def __init__(
        self, api_key: str | None, paid_enabled: bool, base_url: str = "https://api.deepseek.com"
    ) -> None:
        self.api_key = api_key
        self.paid_enabled = paid_enabled
        self.base_url = base_url.rstrip("/")
        if api_key:
            register_secret(api_key)

    def admission(self, now: datetime) -> base.Reading:
        if not self.paid_enabled:
            return self.refused(
                "config",
                now,
                "the paid key is not enabled (provider_options.deepseek.paid_enabled)",
            )
        if not self.api_key:
            return self.refused("config", now, "DEEPSEEK_API_KEY is not set")
        if not TOKEN.match(self.api_key):  # it would not even fit in a header
            return self.refused("config", now, f"the API key is malformed: expected {TOKEN_RULE}")
        status, body = base.http_get(
            f"{self.base_url}/user/balance", {"Authorization": f"Bearer {self.api_key}"}
        )
        if status != 200 or not isinstance(body, dict):
            return self.refused("/user/balance", now, f"balance unavailable (HTTP {status})")
        if not body.get("is_available"):
            return self.refused("/user/balance", now, "insufficient balance")
        return base.Reading(
            self.name, "/user/balance (synthetic 100%)", now, windows=[base.Window("balance", 0.0)]
        )

    def command(self, run: base.RunRequest) -> base.CommandSpec:
        """Claude Code against DeepSeek's Anthropic-compatible endpoint."""
        from aiworker.adapters.providers.claude import ClaudeProvider

        spec = ClaudeProvider(run.workspace.parent / "home" / ".claude").command(run)
        env = {
            **spec.env,
            "ANTHROPIC_BASE_URL": f"{self.base_url}/anthropic",
            "ANTHROPIC_AUTH_TOKEN": self.api_key or "",
        }
        return base.CommandSpec(spec.argv, env, spec.stdin)

    def parse(self, stdout: bytes, exit_code: int) -> base.RunOutcome:
        from aiworker.adapters.providers.claude import ClaudeProvider

        return ClaudeProvider(Path("/nonexistent")).parse(stdout, exit_code)
