"""OpenCode: opt-in behind a verified zero-spend budget guard; `opencode run --format json`."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from aiworker.adapters.providers import base

GUARD_FIELDS = (
    "account",
    "cli_version",
    "adapter",
    "zero_spend_verified",
    "budget_usd",
    "evidence",
)


class OpenCodeProvider(base.CliProvider):
    name: ClassVar[str] = "opencode"

    def __init__(self, guard: Path | None) -> None:
        self.guard = guard

    def admission(self, now: datetime) -> base.Reading:
        if self.guard is None:
            return self.refused(
                "budget guard", now, "opt-in: no zero-spend budget guard is configured"
            )
        try:
            guard = json.loads(self.guard.read_text())
        except (OSError, ValueError):
            return self.refused(
                "budget guard", now, f"budget guard {self.guard} is absent or unreadable"
            )
        missing = [f for f in GUARD_FIELDS if not isinstance(guard, dict) or f not in guard]
        if missing:
            return self.refused("budget guard", now, f"budget guard lacks {', '.join(missing)}")
        if guard["zero_spend_verified"] is not True or float(guard["budget_usd"]) != 0.0:
            return self.refused("budget guard", now, "budget guard does not verify zero spend")
        windows = [
            base.Window(str(w["name"]), float(w["used_percent"]), weekly=bool(w.get("weekly")))
            for w in guard.get("windows", [])
        ]
        return base.Reading(self.name, f"budget guard ({guard['adapter']})", now, windows=windows)

    def command(self, run: base.RunRequest) -> base.CommandSpec:
        return opencode_command(run.workspace.parent / "home", run.model, run.workspace, run.prompt)

    def parse(self, stdout: bytes, exit_code: int) -> base.RunOutcome:
        return opencode_parse(stdout, exit_code)


def opencode_command(
    home: Path,
    model: str | None,
    workspace: Path,
    prompt: str,
    config_content: dict[str, Any] | None = None,
    *,
    local: bool = False,
) -> base.CommandSpec:
    """`opencode run --format json`, auto-approving inside the disposable workspace. The
    prompt goes on stdin, never argv: argv is visible in `ps`, capped at 128 KiB per
    string, and opencode wraps an argument holding spaces in literal quotes."""
    argv = ["opencode", "run", "--format", "json", "--auto", "--pure", "--dir", str(workspace)]
    if model:
        argv += ["-m", model]
    if local:  # a title of its own: OpenCode then asks the model for none
        argv += ["--title", "aiworker local try"]
    extra = {
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    }
    if local:  # no summary request of its own when the context fills: the gate ends it
        extra["OPENCODE_DISABLE_AUTOCOMPACT"] = "1"
    if config_content is not None:
        extra["OPENCODE_CONFIG_CONTENT"] = json.dumps(config_content)
    _plugin_dependency_present(home)
    return base.CommandSpec(argv, base.minimal_env(home, extra), prompt.encode())


def _plugin_dependency_present(home: Path) -> None:
    """OpenCode installs `@opencode-ai/plugin` from the npm registry into its config
    folder on every start, unless that folder's lock file already lists it (plugins are
    off: --pure, OPENCODE_DISABLE_DEFAULT_PLUGINS). Listing it keeps a run off the
    network except for its model."""
    folder = home / ".config" / "opencode"
    (folder / "node_modules").mkdir(parents=True, exist_ok=True)
    wanted = {"dependencies": {"@opencode-ai/plugin": "*"}}
    (folder / "package.json").write_text(json.dumps(wanted))
    (folder / "package-lock.json").write_text(json.dumps({"packages": {"": wanted}}))


def opencode_parse(stdout: bytes, exit_code: int) -> base.RunOutcome:
    final = ""
    usage: dict[str, int] = {}
    error = None
    for event in base.json_lines(stdout):
        part = event.get("part") or {}
        if event.get("type") == "text" and isinstance(part, dict):
            final = str(part.get("text", ""))
        elif event.get("type") == "step_finish" and isinstance(part, dict):
            for key, value in (part.get("tokens") or {}).items():
                if isinstance(value, int):
                    usage[key] = usage.get(key, 0) + value
        elif event.get("type") == "error":
            detail = event.get("error") or {}
            data = detail.get("data") or {}
            error = str(data.get("message") or detail.get("name"))
            if data.get("statusCode"):
                error += f" (HTTP {data['statusCode']})"
    if exit_code != 0 or error:
        return base.RunOutcome(None, usage, error or f"opencode exited {exit_code}")
    document = base.result_document(final)
    return base.RunOutcome(document, usage, None if document else "no result document")


def llama_opencode_config(base_url: str, model: str, bounds: Any = None) -> dict[str, Any]:
    """OpenCode's provider block for a llama.cpp server (its OpenAI-compatible API), with
    the try's context and per-request output as the model's limits (BOUNDS), and no
    sharing, no automatic updates and no small model for side tasks."""
    entry: dict[str, Any] = {"tools": True}
    if bounds is not None:
        entry["limit"] = {"context": bounds.context_tokens, "output": bounds.tokens_per_request}
    return {
        "provider": {
            "llamacpp": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "llama.cpp",
                "options": {"baseURL": f"{base_url.rstrip('/')}/v1", "apiKey": "local"},
                "models": {model: entry},
            }
        },
        "model": f"llamacpp/{model}",
        "small_model": f"llamacpp/{model}",
        "share": "disabled",
        "autoupdate": False,
    }
