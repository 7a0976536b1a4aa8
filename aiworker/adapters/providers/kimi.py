"""Kimi Code CLI: verified login and model, synthetic headroom; exhaustion shows at run time
as its rate-limit errors."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import ClassVar

from aiworker.adapters.providers import base
from aiworker.secrets import register_secret


class KimiProvider(base.CliProvider):
    name: ClassVar[str] = "kimi"

    def __init__(self, home: Path, model: str | None) -> None:
        self.home = home
        self.model = model

    def admission(self, now: datetime) -> base.Reading:
        try:
            credentials = json.loads((self.home / "credentials" / "kimi-code.json").read_text())
        except (OSError, ValueError):
            return self.refused("kimi login", now, "no Kimi Code login in the private home")
        if not isinstance(credentials, dict) or not credentials.get("access_token"):
            return self.refused("kimi login", now, "login has no token")
        register_secret(str(credentials["access_token"]))
        if not self.model:
            return self.refused("kimi login", now, "no model selected for kimi")
        return base.Reading(
            self.name,
            "kimi login (synthetic headroom)",
            now,
            windows=[base.Window("synthetic", 0.0)],
        )

    def classify(self, failure: str) -> str:
        lowered = failure.lower()
        if "exceeded_current_quota" in lowered or "insufficient_quota" in lowered:
            return "quota_exhausted"
        return super().classify(failure)

    def command(self, run: base.RunRequest) -> base.CommandSpec:
        return kimi_command(self.home, run.model or self.model, run.prompt)

    def parse(self, stdout: bytes, exit_code: int) -> base.RunOutcome:
        return kimi_parse(stdout, exit_code)


def kimi_command(home: Path, model: str | None, prompt: str) -> base.CommandSpec:
    """`kimi -p PROMPT --output-format stream-json` (prompt by argv only), private home."""
    argv = ["kimi", "-p", prompt, "--output-format", "stream-json"]
    if model:
        argv += ["-m", model]
    env = base.minimal_env(home, {"KIMI_CODE_HOME": str(home), "KIMI_DISABLE_TELEMETRY": "1"})
    return base.CommandSpec(argv, env)


def kimi_parse(stdout: bytes, exit_code: int) -> base.RunOutcome:
    final = ""
    for event in base.json_lines(stdout):
        if event.get("role") == "assistant" and isinstance(event.get("content"), str):
            final = event["content"]
    if exit_code != 0:
        return base.RunOutcome(None, {}, f"kimi exited {exit_code}")
    document = base.result_document(final)
    return base.RunOutcome(document, {}, None if document else "no result document")
