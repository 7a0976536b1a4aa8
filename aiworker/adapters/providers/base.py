"""The provider interface: capabilities, a quota reading without inference, and failures."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar, Protocol

FAILURE_CLASSES = ("quota_exhausted", "auth", "transient", "invalid", "other")
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


class Provider(Protocol):
    name: ClassVar[str]
    phases: ClassVar[tuple[str, ...]]
    # Providers with measured windows need every window they name to be read.
    measured_windows: ClassVar[tuple[str, ...]]

    def admission(self, now: datetime) -> Reading: ...

    def classify(self, failure: str) -> str: ...


def classify_text(text: str) -> str:
    """Map a failure message to one of FAILURE_CLASSES (shared phrases across CLIs)."""
    lowered = text.lower()
    quota = (
        "usage limit",
        "hit your limit",
        "quota",
        "insufficient_quota",
        "exceeded_current_quota",
        "out of credits",
        "insufficient balance",
        "402",
    )
    if any(word in lowered for word in quota):
        return "quota_exhausted"
    if any(
        word in lowered
        for word in ("unauthorized", "401", "not logged in", "invalid api key", "authentication")
    ):
        return "auth"
    if any(
        word in lowered
        for word in (
            "overloaded",
            "503",
            "timeout",
            "timed out",
            "capacity",
            "connection reset",
            "rate limit",
        )
    ):
        return "transient"
    if any(word in lowered for word in ("schema", "invalid", "malformed")):
        return "invalid"
    return "other"
