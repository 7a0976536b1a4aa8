"""The `script` provider: replays a scenario file instead of calling a model.

It is a real provider for dry runs, the demo and the tests. A scenario is JSON:

    {"windows": [{"name": "5h", "used_percent": 42, "weekly": false,
                  "resets_at": "2026-11-30T12:00:00Z"}],
     "admission_error": null,      # a string makes the reading invalid
     "blocked": false,             # true: the next run would spend paid credits
     "failure": null,              # quota_exhausted | auth | transient | invalid | other
     "sleep_s": 0,                 # seconds to take before answering, as a model does
     "edits": {"path/in/repo": "new content"},
     "result": {...}}              # the agent result document to hand back
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from aiworker.adapters.providers import base


class ScriptProvider(base.CliProvider):
    name: ClassVar[str] = "script"
    editable_settings: ClassVar[tuple[str, ...]] = ("enabled",)

    def __init__(
        self,
        scenario: Path | None,
        name: str = "script",
        like: object | None = None,
        home: Path | None = None,
    ) -> None:
        # Any provider may replay a scenario instead of its CLI (a dry run of that slot),
        # keeping that provider's capabilities (LIKE): its phases, simple-only, budgets.
        self.scenario = scenario
        self.home = home  # a persistent home to be lent, as a CLI's login is
        self.name = name  # type: ignore[misc]
        if like is not None:
            self.phases = like.phases  # type: ignore[attr-defined,misc]
            self.simple_only = getattr(like, "simple_only", False)
            self.diff_budget_lines = getattr(like, "diff_budget_lines", None)

    def load(self) -> dict[str, Any]:
        if self.scenario is None:
            raise FileNotFoundError("provider_options.script.scenario is not set")
        document = json.loads(self.scenario.read_text(encoding="utf-8"))
        if not isinstance(document, dict):
            raise ValueError("a scenario must be a JSON object")
        return document

    def admission(self, now: datetime) -> base.Reading:
        source = f"scenario {self.scenario}"
        try:
            document = self.load()
            windows = [
                base.Window(
                    name=str(w["name"]),
                    used_percent=float(w["used_percent"]),
                    resets_at=datetime.fromisoformat(w["resets_at"].replace("Z", "+00:00"))
                    if w.get("resets_at")
                    else None,
                    weekly=bool(w.get("weekly", False)),
                )
                for w in document.get("windows", [])
            ]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return self.refused(source, now, f"scenario unreadable: {exc}")
        error = document.get("admission_error")
        if error:
            return self.refused(source, now, str(error))
        return base.Reading(
            self.name,
            source,
            now,
            windows=windows,
            blocked=bool(document.get("blocked", False)),
            reason="paid credits would be spent" if document.get("blocked") else "",
        )

    def command(self, run: base.RunRequest) -> base.CommandSpec:
        if self.scenario is None:
            raise FileNotFoundError("provider_options.script.scenario is not set")
        argv = [
            sys.executable,
            "-m",
            "aiworker.script_agent",
            str(self.scenario),
            run.phase,
        ]
        return base.CommandSpec(
            argv, base.minimal_env(self.home or run.workspace.parent / "home"), run.prompt.encode()
        )

    def parse(self, stdout: bytes, exit_code: int) -> base.RunOutcome:
        events = [e for e in base.json_lines(stdout) if e.get("type") == "result"]
        if exit_code != 0 or not events:
            return base.RunOutcome(None, {}, f"script provider exited {exit_code}")
        result = events[-1].get("result")
        return base.RunOutcome(
            result if isinstance(result, dict) else None,
            {},
            None if isinstance(result, dict) else "no result document",
        )

    def classify(self, failure: str) -> str:
        return (
            failure
            if failure in ("quota_exhausted", "auth", "transient", "invalid")
            else super().classify(failure)
        )
