"""The provider interface: capabilities, a quota reading without inference, and failures."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol

import requests
import urllib3

from aiworker.runtime.answers import AnswerRefused, read_whole

# environment: the CLI refuses to run here as set up (e.g. claude's permission bypass as
# root); another provider may, this one will not until the installation changes.
FAILURE_CLASSES = ("quota_exhausted", "auth", "transient", "environment", "invalid", "other")
PHASES = ("planning", "implementation", "review")


@dataclass(frozen=True)
class Window:
    """One measured quota window."""

    name: str
    used_percent: float
    resets_at: datetime | None = None
    # Weekly and model-specific weekly windows use weekly_reserve_percent.
    weekly: bool = False


@dataclass(frozen=True)
class Reading:
    """What a provider's quota signal says now; an invalid reading makes it unavailable."""

    provider: str
    source: str
    observed_at: datetime
    valid: bool = True
    windows: list[Window] = field(default_factory=list)
    reason: str = ""
    # E.g. the next run would spend paid credits: defer even with headroom.
    blocked: bool = False


@dataclass(frozen=True)
class RunRequest:
    """One fresh session a phase asks of a provider: in WORKSPACE, on PROMPT, ending with
    a result document valid against SCHEMA."""

    phase: str
    model: str | None
    effort: str | None
    workspace: Path
    schema: Path
    prompt: str


class Provider(Protocol):
    name: ClassVar[str]
    phases: ClassVar[tuple[str, ...]]
    # Providers with measured windows need every window they name to be read.
    measured_windows: ClassVar[tuple[str, ...]]
    # Per-phase settings an operator may change for this provider.
    editable_settings: ClassVar[tuple[str, ...]]

    def admission(self, now: datetime) -> Reading: ...

    def classify(self, failure: str) -> str: ...


class CliProvider:
    """What every adapter shares: its capabilities (every phase unless it names fewer),
    the shape of a reading that keeps it out, and the failure classes shared across CLIs.
    An adapter adds how it reads its quota without inference (admission), how it starts
    one session of its CLI (command) and what it makes of what the CLI printed (parse)."""

    name: ClassVar[str]
    phases: ClassVar[tuple[str, ...]] = PHASES
    editable_settings: ClassVar[tuple[str, ...]] = ("enabled", "model")
    measured_windows: ClassVar[tuple[str, ...]] = ()

    def refused(self, source: str, now: datetime, reason: str) -> Reading:
        """A reading that keeps the provider out for now, and why."""
        return Reading(self.name, source, now, valid=False, reason=reason)

    def classify(self, failure: str) -> str:
        return classify_text(failure)

    def command(self, run: RunRequest) -> CommandSpec:
        raise NotImplementedError

    def parse(self, stdout: bytes, exit_code: int) -> RunOutcome:
        raise NotImplementedError


def http_status(text: str, code: str) -> bool:
    """CODE stands in TEXT as an HTTP status: a number of its own, not a piece of a
    timestamp (12:40:21.402), a version, a path, a request id or a token (5a402b)."""
    return re.search(rf"(?<![\w.:/-]){code}(?![\w.:/-])", text) is not None


def classify_text(text: str) -> str:
    """Map a failure message to one of FAILURE_CLASSES (shared phrases across CLIs)."""
    lowered = text.lower()
    if "cannot be used with root" in lowered:
        return "environment"
    quota = (
        "usage limit",
        "hit your limit",
        "quota",
        "insufficient_quota",
        "exceeded_current_quota",
        "out of credits",
        "insufficient balance",
    )
    if any(word in lowered for word in quota) or http_status(lowered, "402"):
        return "quota_exhausted"
    if any(
        word in lowered
        for word in (
            "unauthorized",
            "not logged in",
            "invalid api key",
            "invalid x-api-key",
            "incorrect api key",
            "authentication",
        )
    ) or http_status(lowered, "401"):
        return "auth"
    if any(
        word in lowered
        for word in (
            "overloaded",
            "timeout",
            "timed out",
            "capacity",
            "connection reset",
            "stream disconnected",
            "connection failed",
            "cannot connect",
            "unable to connect",
            "rate limit",
        )
    ) or http_status(lowered, "503"):
        return "transient"
    if any(word in lowered for word in ("schema", "invalid", "malformed")):
        return "invalid"
    return "other"


@dataclass(frozen=True)
class CommandSpec:
    """How to start one fresh, non-interactive session of a provider's CLI."""

    argv: list[str]
    env: dict[str, str]
    stdin: bytes | None = None


@dataclass(frozen=True)
class RunOutcome:
    """What a finished run said: the agent result document, usage, or why it failed."""

    result: dict[str, object] | None
    usage: dict[str, int] = field(default_factory=dict)
    error: str | None = None


def json_lines(stream: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL stream; other lines (progress, banners) are skipped."""
    events = []
    for raw in stream.splitlines():
        line = raw.strip()
        if not line.startswith(b"{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            events.append(value)
    return events


def result_document(text: str) -> dict[str, object] | None:
    """The agent result document from a final message (JSON, possibly fenced)."""
    text = text.strip()
    if text.startswith("```"):
        text = text.strip("`")
        text = text.split("\n", 1)[1] if "\n" in text else text
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def minimal_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A private HOME and nothing inherited but PATH and the locale."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_CACHE_HOME": str(home / ".cache"),
    }
    env.update(extra or {})
    return env


HTTP_GET_SECONDS = 15.0  # a whole answer to an admission check
HTTP_GET_BYTES = 1024 * 1024


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, the JSON body or None) of a GET, answered whole within HTTP_GET_SECONDS
    and HTTP_GET_BYTES; (0, why) when it was not (refused, too slow, too large)."""
    started = time.monotonic()
    # As it is, and from where it was asked: a redirect's answer would be read unbounded.
    plain = {**(headers or {}), "Accept-Encoding": "identity"}
    try:
        response = requests.get(url, headers=plain, timeout=10, stream=True, allow_redirects=False)
        data = read_whole(response, started=started, seconds=HTTP_GET_SECONDS, limit=HTTP_GET_BYTES)
    except AnswerRefused as exc:
        return 0, str(exc)
    except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        return 0, type(exc).__name__
    try:
        return response.status_code, json.loads(data)
    except ValueError:
        return response.status_code, None
