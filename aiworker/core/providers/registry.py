"""Provider readings and admission for `providers status` and `providers check`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiworker.adapters.providers.base import Reading, Window
from aiworker.adapters.providers.claude import ClaudeProvider
from aiworker.adapters.providers.codex import CodexProvider
from aiworker.adapters.providers.deepseek import DeepSeekProvider
from aiworker.adapters.providers.kimi import KimiProvider
from aiworker.adapters.providers.llama import LlamaProvider
from aiworker.adapters.providers.opencode import OpenCodeProvider
from aiworker.adapters.providers.script import ScriptProvider
from aiworker.config.loader import LoadedConfig
from aiworker.config.models import PROVIDER_NAMES, ProviderOptions
from aiworker.core.context import Environment
from aiworker.core.guests.backends import isolation_refusal
from aiworker.core.providers.admission import (
    Decision,
    backoff_until,
    capability_reason,
    enabled_for,
    provider_settings,
    select_provider,
)
from aiworker.core.report import Report
from aiworker.errors import InvalidInput
from aiworker.runtime.atomic import private_directory
from aiworker.store.engine import Database, Session, sqlite_path
from aiworker.store.observations import consecutive_failures, record_observation, running_jobs

REPORTED_PHASES = ("planning", "implementation", "review")
# Every provider class, for its capability metadata (phases, editable settings).
PROVIDER_CLASSES = (
    CodexProvider,
    ClaudeProvider,
    KimiProvider,
    DeepSeekProvider,
    OpenCodeProvider,
    LlamaProvider,
    ScriptProvider,
)


def _path(loaded: LoadedConfig, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else loaded.path.parent / path


@dataclass(frozen=True)
class Misconfigured:
    """A provider its configuration keeps out (a home that holds aiworker's state): it is
    never admitted, its reading and every phase say why, and nothing is charged for it."""

    name: str
    reason: str
    measured_windows: tuple[str, ...] = ()

    def admission(self, now: datetime) -> Reading:
        return Reading(self.name, "config", now, valid=False, reason=self.reason)


def _home(env: Environment, name: str, value: str) -> Path:
    """The configured home of provider NAME; refused when it holds aiworker's own state.
    A home is copied for every run with plain file reads, and closing a descriptor of
    the database drops this process's SQLite locks (another process would then delete
    the WAL under it); the state directory would also copy itself into the copy."""
    home = _path(env.loaded, value)
    database = sqlite_path(env.database_url)
    for what, inside in (("state directory", env.state_dir), ("database", database)):
        held = inside.resolve() if inside is not None else None
        if held is not None and (home.resolve() == held or home.resolve() in held.parents):
            raise InvalidInput(
                f"provider_options.{name}.home {home} holds aiworker's {what} ({inside}); "
                "give the provider a home of its own"
            )
    return home


def provider_for(env: Environment, name: str) -> Any:  # noqa: PLR0911 - one per provider
    """The adapter for NAME built from the configuration; a scenario replaces any of them."""
    loaded = env.loaded
    options = loaded.config.provider_options.get(name) or ProviderOptions()  # type: ignore[call-overload]
    try:
        configured = _home(env, name, options.home) if options.home else None
    except InvalidInput as exc:
        return Misconfigured(name, exc.message)
    if options.scenario:
        real = {"llama": LlamaProvider(None, options.diff_budget_lines, options.bounds)}
        # With `home` set, the replay is lent that home as a CLI would be (its login).
        return ScriptProvider(
            _path(loaded, options.scenario), name=name, like=real.get(name), home=configured
        )
    home = configured or env.state_dir / "providers" / name
    if name in ("codex", "claude", "kimi"):
        # Each provider's own private home: no CLI can read another's credentials.
        private_directory(home)
    if name == "codex":
        return CodexProvider(home)
    if name == "claude":
        return ClaudeProvider(home)
    if name == "kimi":
        settings = provider_settings(loaded.config, "implementation", "kimi")
        return KimiProvider(home, settings.model if settings else None)
    if name == "deepseek":
        return DeepSeekProvider(
            os.environ.get(options.api_key_env),
            options.paid_enabled,
            options.base_url or "https://api.deepseek.com",
        )
    if name == "opencode":
        return OpenCodeProvider(_path(loaded, options.guard) if options.guard else None)
    if name == "llama":
        return LlamaProvider(options.base_url, options.diff_budget_lines, options.bounds)
    return ScriptProvider(None)


def read_provider(env: Environment, name: str, now: datetime) -> tuple[Reading, tuple[str, ...]]:
    """A reading for NAME and the windows it must contain, without spending inference."""
    provider = provider_for(env, name)
    return provider.admission(now), provider.measured_windows


def backoffs(session: Session, names: Iterable[str]) -> dict[str, datetime]:
    """Providers still backing off after consecutive failures, and until when."""
    found: dict[str, datetime] = {}
    for name in names:
        until = backoff_until(*consecutive_failures(session, name))
        if until is not None:
            found[name] = until
    return found


def capability_check(
    env: Environment, phase: str, *, simple: bool = False, tried_here: Iterable[str] = ()
) -> Callable[[str], str | None]:
    """Why a provider cannot serve PHASE now (its capabilities, or no isolation to run it
    in); TRIED_HERE had their one local try already."""
    tried = set(tried_here)

    def check(name: str) -> str | None:
        provider = provider_for(env, name)
        if isinstance(provider, Misconfigured):
            return provider.reason
        reason = capability_reason(provider, phase, simple=simple)
        if reason is None and name in tried and getattr(provider, "diff_budget_lines", None):
            reason = f"{name} already had its one local try at this snapshot"
        return reason or isolation_refusal(env, name)

    return check


def one_try_per_snapshot(env: Environment, name: str) -> bool:
    """Whether NAME is a local model: one try per snapshot, then the next provider."""
    return bool(getattr(provider_for(env, name), "diff_budget_lines", None))


def fallbacks(
    env: Environment, phase: str, *, simple: bool, tried_here: Iterable[str]
) -> list[str]:
    """The configured providers that could still serve PHASE at this snapshot: enabled
    for it, capable, isolated, and not a local model that had its try here (quota and
    backoff are read when one is chosen)."""
    config = env.loaded.config
    check = capability_check(env, phase, simple=simple, tried_here=tried_here)
    return [
        n
        for n in config.providers
        if enabled_for(config, phase, n, simple=simple) and check(n) is None
    ]


def observe(db: Database, decisions: list[Decision]) -> None:
    """Record every admission decision as a provider observation with its reason."""
    with db.write() as session:
        for decision in decisions:
            reading = decision.reading
            if reading is None:
                record_observation(
                    session,
                    provider=decision.provider,
                    window="-",
                    used_percent=None,
                    resets_at=None,
                    valid=False,
                    source="config",
                    reason=decision.reason,
                )
                continue
            windows: list[Window | None] = [*reading.windows] or [None]
            for window in windows:
                record_observation(
                    session,
                    provider=decision.provider,
                    window=window.name if window else "-",
                    used_percent=window.used_percent if window else None,
                    resets_at=window.resets_at if window else None,
                    valid=reading.valid,
                    source=reading.source,
                    reason=decision.reason,
                )


@dataclass
class ProvidersReport(Report):
    suspended: bool
    phases: dict[str, str | None]
    providers: dict[str, dict[str, Any]]


def providers_status(env: Environment, only: str | None = None) -> ProvidersReport:
    config = env.loaded.config
    if only is not None and only not in PROVIDER_NAMES:
        raise InvalidInput(f"unknown provider {only!r}; known: {', '.join(PROVIDER_NAMES)}")
    now = datetime.now(UTC)
    cache: dict[str, tuple[Reading, tuple[str, ...]]] = {}

    def read(name: str) -> tuple[Reading, tuple[str, ...]]:
        if name not in cache:
            cache[name] = read_provider(env, name, now)
        return cache[name]

    db = env.open_database()
    try:
        names = [only] if only else list(config.providers)
        with db.read() as session:
            running = running_jobs(session)
            backoff = backoffs(session, {*names, *config.providers})
        report: dict[str, Any] = {"suspended": not config.providers, "phases": {}, "providers": {}}
        for phase in REPORTED_PHASES:
            selection = select_provider(
                config,
                phase,
                read,
                running,
                now,
                backoff=backoff,
                capable=capability_check(env, phase),
            )
            report["phases"][phase] = selection.provider
            for decision in selection.decisions:
                entry = report["providers"].setdefault(decision.provider, {"eligible": {}})
                entry["eligible"][phase] = {
                    "eligible": decision.eligible,
                    "reason": decision.reason,
                }
                if decision.windows:
                    entry["windows"] = [vars(v) for v in decision.windows]
            observe(db, [d for d in selection.decisions if d.provider in names])
        for name in names:
            reading, _ = read(name)
            entry = report["providers"].setdefault(name, {"eligible": {}})
            entry["running_jobs"] = running.get(name, 0)
            adapter = provider_for(env, name)
            entry["capabilities"] = {
                "phases": list(getattr(adapter, "phases", ())),
                "measured_windows": list(getattr(adapter, "measured_windows", ())),
                "editable_settings": list(getattr(adapter, "editable_settings", ())),
                "simple_only": bool(getattr(adapter, "simple_only", False)),
            }
            entry["reading"] = {
                "valid": reading.valid,
                "source": reading.source,
                "reason": reading.reason,
                "observed_at": reading.observed_at.isoformat(),
                "windows": [
                    {
                        "name": w.name,
                        "used_percent": w.used_percent,
                        "resets_at": w.resets_at.isoformat() if w.resets_at else None,
                        "weekly": w.weekly,
                    }
                    for w in reading.windows
                ],
            }
        if only:
            report["providers"] = {only: report["providers"][only]}
        return ProvidersReport(report["suspended"], report["phases"], report["providers"])
    finally:
        db.dispose()
