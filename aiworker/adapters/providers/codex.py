"""OpenAI Codex CLI: `codex exec --json`, quota from `codex app-server` without inference."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from aiworker.adapters.providers import base
from aiworker.runtime.processes import converse
from aiworker.secrets import redact

WEEK_MINUTES = 7 * 24 * 60
APP_SERVER_SECONDS = 20
APP_SERVER_REQUESTS = (
    {
        "id": 1,
        "method": "initialize",
        "params": {"clientInfo": {"name": "aiworker", "version": "0"}},
    },
    {"method": "initialized"},
    {"id": 2, "method": "account/rateLimits/read", "params": {}},
)


def window_of(snapshot: dict[str, Any] | None, fallback: str) -> base.Window | None:
    if not snapshot or snapshot.get("usedPercent") is None:
        return None
    minutes = int(snapshot.get("windowDurationMins") or 0)
    resets = snapshot.get("resetsAt")
    weekly = minutes >= WEEK_MINUTES or (minutes == 0 and fallback == "weekly")
    name = "weekly" if weekly else (f"{minutes // 60}h" if minutes else fallback)
    return base.Window(
        name=name,
        used_percent=float(snapshot["usedPercent"]),
        resets_at=datetime.fromtimestamp(int(resets), UTC) if resets else None,
        weekly=weekly,
    )


def reading_from_rate_limits(result: dict[str, Any], now: datetime) -> base.Reading:
    """`account/rateLimits/read` → windows; defer when paid credits would be spent."""
    limits = result.get("rateLimits") or {}
    windows = [
        w
        for w in (
            window_of(limits.get("primary"), "primary"),
            window_of(limits.get("secondary"), "weekly"),
        )
        if w
    ]
    reached = limits.get("rateLimitReachedType")
    ordinary = result.get("ordinaryUsageAllowed")
    credits = limits.get("credits") or {}
    blocked = bool(reached) or ordinary is False or bool(limits.get("spendControlReached"))
    reason = ""
    if blocked:
        reason = f"limit reached ({reached})" if reached else "ordinary usage exhausted"
        if credits.get("hasCredits"):
            reason += "; the next run would spend paid credits"
    return base.Reading(
        "codex",
        "codex app-server account/rateLimits/read",
        now,
        windows=windows,
        blocked=blocked,
        reason=reason,
    )


def _answers_rate_limits(line: bytes) -> bool:
    events = base.json_lines(line)
    return bool(events) and events[0].get("id") == 2


class CodexProvider(base.CliProvider):
    name: ClassVar[str] = "codex"
    editable_settings: ClassVar[tuple[str, ...]] = ("enabled", "model", "effort")
    measured_windows: ClassVar[tuple[str, ...]] = ("5h", "weekly")

    def __init__(self, home: Path, binary: str = "codex") -> None:
        self.home = home  # CODEX_HOME holding auth.json; never under /tmp (codex refuses)
        self.binary = binary

    def admission(self, now: datetime) -> base.Reading:
        # The app-server drops what it has not answered once its stdin closes: keep the
        # session open until the rate-limit answer (id 2) or the deadline.
        result = converse(
            [self.binary, "app-server"],
            [json.dumps(r).encode() for r in APP_SERVER_REQUESTS],
            answered=_answers_rate_limits,
            env=base.minimal_env(self.home, {"CODEX_HOME": str(self.home)}),
            timeout=APP_SERVER_SECONDS,
        )
        for event in base.json_lines(result.stdout.encode()):
            if event.get("id") == 2:
                if "error" in event:
                    error = event["error"]
                    message = error.get("message") if isinstance(error, dict) else error
                    return self.refused("codex app-server", now, str(message)[:200])
                return reading_from_rate_limits(event.get("result") or {}, now)
        why = "timed out" if result.returncode == 124 else f"exit {result.returncode}"
        said = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        if said:
            why += f": {redact(said[-1].removeprefix('Error:').strip())[:200]}"
        return self.refused("codex app-server", now, f"no rate-limit answer ({why})")

    def command(self, run: base.RunRequest) -> base.CommandSpec:
        argv = [
            self.binary,
            "exec",
            "--json",
            "--ephemeral",
            "--ignore-user-config",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--output-schema",
            str(run.schema),
            "-C",
            str(run.workspace),
        ]
        if run.model:
            argv += ["-m", run.model]
        if run.effort:
            argv += ["-c", f'model_reasoning_effort="{run.effort}"']
        # unbounded_connection_retries (on by default) makes a network outage retry for
        # ever; without it codex ends with turn.failed after five reconnects.
        for feature in (
            "plugins",
            "apps",
            "browser_use",
            "computer_use",
            "image_generation",
            "unbounded_connection_retries",
        ):
            argv += ["--disable", feature]
        argv.append("-")
        env = base.minimal_env(self.home, {"CODEX_HOME": str(self.home)})
        return base.CommandSpec(argv, env, run.prompt.encode())

    def parse(self, stdout: bytes, exit_code: int) -> base.RunOutcome:
        """Only `turn.failed` (or a non-zero exit) is a failure: `error` events such as
        "Reconnecting... 2/5" and error items are warnings a successful run also prints."""
        final = None
        usage: dict[str, int] = {}
        failed = None
        warning = None
        for event in base.json_lines(stdout):
            kind = event.get("type")
            item = event.get("item") or {}
            if (
                kind == "item.completed"
                and isinstance(item, dict)
                and item.get("type") == "agent_message"
            ):
                final = str(item.get("text", ""))
            elif kind == "turn.completed":
                usage = {
                    k: int(v) for k, v in (event.get("usage") or {}).items() if isinstance(v, int)
                }
            elif kind == "turn.failed":
                detail = event.get("error") or {}
                failed = str(detail.get("message") if isinstance(detail, dict) else detail)
            elif kind == "error":
                warning = str(event.get("message") or "")
        if failed is not None or exit_code != 0:
            return base.RunOutcome(None, usage, failed or warning or f"codex exited {exit_code}")
        document = base.result_document(final or "")
        return base.RunOutcome(document, usage, None if document else "no result document")
