"""The admission rule at its edges, table-driven."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from aiworker.adapters.providers.base import Reading, Window
from aiworker.config.models import Config
from aiworker.core.providers.admission import evaluate, provider_settings, select_provider

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def reading(*windows, **extra):
    return Reading("codex", "test", extra.pop("observed_at", NOW), windows=list(windows), **extra)


@pytest.mark.parametrize(
    ("used", "running", "reserve", "eligible"),
    [
        (89, 0, 10, True),  # 11 > 10
        (90, 0, 10, False),  # 10 == 10: equality defers
        (85, 0, 10, True),
        (85, 1, 10, False),  # one other running job: 100 - 85 - 5 = 10
        (79, 2, 10, True),  # 100 - 79 - 10 = 11
        (0, 0, 0, True),
        (100, 0, 0, False),
    ],
)
def test_short_window(used, running, reserve, eligible):
    config = Config(reserve_percent=reserve)
    decision = evaluate(reading(Window("5h", used)), running, config, NOW)
    assert decision.eligible is eligible, decision.reason


@pytest.mark.parametrize(
    ("weekly_reserve", "used", "eligible"),
    [
        (20.0, 79, True),  # 21 > 20
        (20.0, 80, False),  # the weekly reserve overrides the ordinary one
        (None, 89, True),  # inherits reserve_percent 10
        (None, 90, False),
    ],
)
def test_weekly_reserve_overrides_and_inherits(weekly_reserve, used, eligible):
    config = Config(reserve_percent=10, weekly_reserve_percent=weekly_reserve)
    decision = evaluate(reading(Window("5h", 0), Window("week", used, weekly=True)), 0, config, NOW)
    assert decision.eligible is eligible, decision.reason


def test_missing_weekly_window_makes_the_provider_unavailable():
    decision = evaluate(reading(Window("5h", 10)), 0, Config(), NOW, required=("5h", "week"))
    assert not decision.eligible
    assert decision.reason == "unavailable: no reading for window week"


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"valid": False, "reason": "not logged in"}, "unavailable: not logged in"),
        ({"observed_at": NOW - timedelta(hours=1)}, "unavailable: the quota reading is stale"),
        (
            {"blocked": True, "reason": "paid credits would be spent"},
            "deferred: paid credits would be spent",
        ),
    ],
)
def test_invalid_stale_and_blocked_readings(kwargs, reason):
    decision = evaluate(reading(Window("5h", 0), **kwargs), 0, Config(), NOW)
    assert (decision.eligible, decision.reason) == (False, reason)


def test_empty_provider_list_suspends_inference():
    selection = select_provider(Config(), "implementation", pytest.fail, {}, NOW)
    assert selection.suspended
    assert selection.provider is None


def test_order_disabled_phases_and_lazy_reads():
    config = Config.model_validate(
        {
            "providers": ["claude", "codex", "kimi"],
            "phases": {"implementation": {"providers": {"claude": {"enabled": False}}}},
        }
    )
    asked = []
    used = {"codex": 95, "kimi": 30}

    def read(name):
        asked.append(name)
        return Reading(name, "test", NOW, windows=[Window("5h", used[name])]), ()

    selection = select_provider(config, "implementation", read, {}, NOW)
    assert selection.provider == "kimi"
    assert asked == ["codex", "kimi"]  # claude was skipped before any quota read
    assert [d.reason.split(":")[0] for d in selection.decisions] == [
        "disabled for implementation",
        "deferred",
        "eligible",
    ]
    # Planning is not disabled for claude, so it is read first there.
    asked.clear()
    used["claude"] = 0
    assert select_provider(config, "planning", read, {}, NOW).provider == "claude"


def test_validation_uses_implementation_settings_and_simple_layers_over_them():
    config = Config.model_validate(
        {
            "phases": {
                "implementation": {"providers": {"codex": {"model": "big", "effort": "high"}}},
                "simple_implementation": {"providers": {"codex": {"effort": "low"}}},
            }
        }
    )
    assert provider_settings(config, "validation", "codex").model == "big"
    simple = provider_settings(config, "implementation", "codex", simple=True)
    assert (simple.model, simple.effort) == ("big", "low")
    assert provider_settings(config, "review", "codex") is None


def test_failures_back_off_exponentially_and_skip_the_provider():
    from aiworker.core.providers.admission import backoff_until

    assert backoff_until(0, None) is None
    assert backoff_until(1, NOW) == NOW + timedelta(minutes=1)
    assert backoff_until(3, NOW) == NOW + timedelta(minutes=4)
    assert backoff_until(30, NOW) == NOW + timedelta(hours=1)
    config = Config.model_validate({"providers": ["codex", "kimi"]})

    def read(name):
        return Reading(name, "test", NOW, windows=[Window("5h", 0)]), ()

    until = {"codex": NOW + timedelta(minutes=2)}
    selection = select_provider(config, "review", read, {}, NOW, backoff=until)
    assert selection.provider == "kimi"
    assert selection.decisions[0].reason.startswith("backing off after failures until")
    later = select_provider(config, "review", read, {}, NOW + timedelta(minutes=3), backoff=until)
    assert later.provider == "codex"
