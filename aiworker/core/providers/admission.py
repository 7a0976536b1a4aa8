"""Choosing a provider for a phase: the configured order, after quota admission.

A provider with measured windows is eligible only if, for every applicable
window, 100 - used_percent - 5 * (other running jobs on it) is strictly greater
than its reserve (reserve_percent; weekly windows use weekly_reserve_percent
when set). Equality defers. Invalid, stale, blocked or incomplete readings make
the provider unavailable; phase/provider combinations turned off are skipped
before any quota is read; an empty list suspends inference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aiworker.adapters.providers.base import Reading
from aiworker.config.models import Config, PhaseSettings, ProviderPhaseSettings

RUNNING_JOB_PENALTY = 5.0
BACKOFF_BASE = timedelta(minutes=1)
BACKOFF_CAP = timedelta(hours=1)
# Validation runs with implementation settings.
PHASE_SETTINGS = {
    "planning": "planning",
    "implementation": "implementation",
    "validation": "implementation",
    "review": "review",
}


@dataclass(frozen=True)
class WindowVerdict:
    name: str
    used_percent: float
    headroom: float
    reserve: float
    ok: bool


@dataclass
class Decision:
    provider: str
    eligible: bool
    reason: str
    windows: list[WindowVerdict] = field(default_factory=list)
    reading: Reading | None = None


@dataclass
class Selection:
    phase: str
    provider: str | None
    decisions: list[Decision]
    suspended: bool = False


def provider_settings(
    config: Config, phase: str, provider: str, *, simple: bool = False
) -> ProviderPhaseSettings | None:
    """The phase's settings for PROVIDER; simple_implementation layers over implementation
    for milestones marked simple and minor review fixes."""
    section: PhaseSettings = getattr(config.phases, PHASE_SETTINGS[phase])
    settings = section.providers.get(provider)  # type: ignore[call-overload]
    if simple and PHASE_SETTINGS[phase] == "implementation":
        layer = config.phases.simple_implementation.providers.get(provider)  # type: ignore[call-overload]
        if layer is not None and settings is not None:
            merged = settings.model_dump() | layer.model_dump(exclude_unset=True)
            return ProviderPhaseSettings(**merged)
        return layer or settings  # type: ignore[no-any-return]
    return settings  # type: ignore[no-any-return]


def enabled_for(config: Config, phase: str, provider: str, *, simple: bool = False) -> bool:
    settings = provider_settings(config, phase, provider, simple=simple)
    return settings is None or settings.enabled


def capability_reason(provider: Any, phase: str, *, simple: bool = False) -> str | None:
    """Why PROVIDER cannot serve PHASE at all (checked before any quota read), or None."""
    served = getattr(provider, "phases", ())
    if PHASE_SETTINGS[phase] not in served:
        return f"{provider.name} does not serve {phase}"
    if getattr(provider, "simple_only", False) and not simple:
        return f"{provider.name} serves only simple milestones and minor review fixes"
    return None


def evaluate(
    reading: Reading,
    running: int,
    config: Config,
    now: datetime,
    required: tuple[str, ...] = (),
    max_age: timedelta = timedelta(minutes=10),
) -> Decision:
    name = reading.provider
    if not reading.valid:
        return Decision(name, False, f"unavailable: {reading.reason}", reading=reading)
    if now - reading.observed_at > max_age:
        return Decision(name, False, "unavailable: the quota reading is stale", reading=reading)
    if reading.blocked:
        return Decision(name, False, f"deferred: {reading.reason or 'blocked'}", reading=reading)
    present = {w.name for w in reading.windows}
    missing = [w for w in required if w not in present]
    if missing:
        return Decision(
            name, False, f"unavailable: no reading for window {', '.join(missing)}", reading=reading
        )
    verdicts = []
    for window in reading.windows:
        reserve = config.effective_weekly_reserve if window.weekly else config.reserve_percent
        headroom = 100.0 - window.used_percent - RUNNING_JOB_PENALTY * running
        verdicts.append(
            WindowVerdict(window.name, window.used_percent, headroom, reserve, headroom > reserve)
        )
    short = [v for v in verdicts if not v.ok]
    if short:
        worst = short[0]
        return Decision(
            name,
            False,
            f"deferred: window {worst.name} headroom {worst.headroom:g} is not above "
            f"its reserve {worst.reserve:g}",
            verdicts,
            reading,
        )
    return Decision(name, True, "eligible", verdicts, reading)


def backoff_until(failures: int, last_failure: datetime | None) -> datetime | None:
    """Failures back off exponentially: 1, 2, 4 ... minutes after the last one, at most an hour."""
    if failures == 0 or last_failure is None:
        return None
    delay: timedelta = min(BACKOFF_BASE * 2 ** (failures - 1), BACKOFF_CAP)
    return last_failure + delay


def select_provider(
    config: Config,
    phase: str,
    read: Callable[[str], tuple[Reading, tuple[str, ...]]],
    running: Mapping[str, int],
    now: datetime,
    *,
    simple: bool = False,
    backoff: Mapping[str, datetime] | None = None,
    capable: Callable[[str], str | None] | None = None,
) -> Selection:
    """Walk the configured order; the first eligible provider wins. READ is called lazily."""
    if not config.providers:
        return Selection(phase, None, [], suspended=True)
    decisions = []
    for name in config.providers:
        if not enabled_for(config, phase, name, simple=simple):
            decisions.append(Decision(name, False, f"disabled for {phase}"))
            continue
        incapable = capable(name) if capable is not None else None
        if incapable is not None:
            decisions.append(Decision(name, False, incapable))
            continue
        until = (backoff or {}).get(name)
        if until is not None and now < until:
            decisions.append(
                Decision(
                    name,
                    False,
                    f"backing off after failures until {until.isoformat(timespec='seconds')}",
                )
            )
            continue
        reading, required = read(name)
        options = config.provider_options.get(name)
        max_age = timedelta(seconds=options.max_reading_age if options else 600)
        decision = evaluate(reading, running.get(name, 0), config, now, required, max_age)
        decisions.append(decision)
        if decision.eligible:
            return Selection(phase, name, decisions)
    return Selection(phase, None, decisions)
