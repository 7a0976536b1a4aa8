"""A local llama.cpp server: healthy, with a free slot; only simple milestones and minor
review fixes, run through OpenCode."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import ClassVar

from aiworker.adapters.providers.base import (
    CommandSpec,
    Reading,
    RunOutcome,
    Window,
    classify_text,
    http_get,
)
from aiworker.adapters.providers.opencode import (
    llama_opencode_config,
    opencode_command,
    opencode_parse,
)


class LlamaProvider:
    name: ClassVar[str] = "llama"
    # Only simple milestones and minor review fixes, one local try per snapshot.
    phases: ClassVar[tuple[str, ...]] = ("implementation", "review")
    editable_settings: ClassVar[tuple[str, ...]] = ("enabled", "model")
    measured_windows: ClassVar[tuple[str, ...]] = ()
    simple_only: ClassVar[bool] = True

    def __init__(self, base_url: str, diff_budget_lines: int = 200) -> None:
        self.base_url = base_url.rstrip("/")
        # One local try per snapshot, and its result must stay within this many lines.
        self.diff_budget_lines = diff_budget_lines

    def admission(self, now: datetime) -> Reading:
        status, body = http_get(f"{self.base_url}/health")
        if status != 200:
            reason = "loading the model" if status == 503 else f"health answered {status or body}"
            return Reading(self.name, "/health", now, valid=False, reason=reason)
        status, _ = http_get(f"{self.base_url}/slots?fail_on_no_slot=1")
        if status == 503:
            return Reading(self.name, "/slots", now, valid=False, reason="no free slot")
        props_status, props = http_get(f"{self.base_url}/props")
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

    def command(
        self,
        phase: str,
        model: str | None,
        effort: str | None,
        workspace: Path,
        schema: Path,
        prompt: str,
    ) -> CommandSpec:
        """OpenCode pointed at the llama.cpp server's OpenAI-compatible API."""
        name = model or "local"
        return opencode_command(
            workspace.parent / "home",
            f"llamacpp/{name}",
            workspace,
            prompt,
            llama_opencode_config(self.base_url, name),
        )

    def parse(self, stdout: bytes, exit_code: int) -> RunOutcome:
        return opencode_parse(stdout, exit_code)
