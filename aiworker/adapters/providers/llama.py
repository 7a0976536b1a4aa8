"""A local llama.cpp server: healthy, with a free slot; only simple milestones and minor
review fixes, run through OpenCode, one bounded try per snapshot.

The server is named by `provider_options.llama.base_url`, never guessed. A try reaches
it only through aiworker's gate (runtime/model_gate.py), which bounds it: `command`
is built for the gate's address once the phase has opened it (`through`)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, ClassVar

from aiworker.adapters.providers import base
from aiworker.adapters.providers.opencode import (
    llama_opencode_config,
    opencode_command,
    opencode_parse,
)

if TYPE_CHECKING:  # the gate itself loads only when a try runs
    from aiworker.runtime.model_gate import Bounds


class LlamaProvider(base.CliProvider):
    name: ClassVar[str] = "llama"
    # Only simple milestones and minor review fixes, one local try per snapshot.
    phases: ClassVar[tuple[str, ...]] = ("implementation", "review")
    simple_only: ClassVar[bool] = True

    def __init__(self, base_url: str | None, diff_budget_lines: int, bounds: Bounds) -> None:
        self.base_url = base_url.rstrip("/") if base_url else None
        # One local try per snapshot, and its result must stay within this many lines.
        self.diff_budget_lines = diff_budget_lines
        self.bounds = bounds
        self.route: str | None = None  # the gate the try goes through

    def through(self, route: str) -> LlamaProvider:
        """This provider with its tries sent to the gate at ROUTE."""
        routed = LlamaProvider(self.base_url, self.diff_budget_lines, self.bounds)
        routed.route = route
        return routed

    def admission(self, now: datetime) -> base.Reading:
        if self.base_url is None:
            return self.refused(
                "configuration",
                now,
                "provider_options.llama.base_url is not set (the llama-server's URL)",
            )
        status, body = base.http_get(f"{self.base_url}/health")
        if status != 200:
            reason = "loading the model" if status == 503 else f"health answered {status or body}"
            return self.refused("/health", now, reason)
        if not isinstance(body, dict) or body.get("status") != "ok":
            # Something else answers there (a proxy's page, another service).
            return self.refused("/health", now, 'health answered 200 without {"status": "ok"}')
        status, _ = base.http_get(f"{self.base_url}/slots?fail_on_no_slot=1")
        if status == 503:
            return self.refused("/slots", now, "no free slot")
        props_status, props = base.http_get(f"{self.base_url}/props")
        slots = (
            props.get("total_slots") if props_status == 200 and isinstance(props, dict) else None
        )
        return base.Reading(
            self.name,
            f"/health, /slots ({slots or '?'} slots)",
            now,
            windows=[base.Window("local", 0.0)],
        )

    def command(self, run: base.RunRequest) -> base.CommandSpec:
        """OpenCode pointed at the gate before the llama.cpp server's OpenAI-compatible
        API, with the try's limits and none of OpenCode's own side requests (a title,
        automatic compaction): the server serves the task's requests only."""
        if self.route is None:
            raise RuntimeError("a local try runs only through its gate (through())")
        name = run.model or "local"
        return opencode_command(
            run.workspace.parent / "home",
            f"llamacpp/{name}",
            run.workspace,
            run.prompt,
            llama_opencode_config(self.route, name, self.bounds),
            local=True,
        )

    def parse(self, stdout: bytes, exit_code: int) -> base.RunOutcome:
        return opencode_parse(stdout, exit_code)
