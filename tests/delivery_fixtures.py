"""A claimed task on the sandbox forge, configured for the script provider."""

from __future__ import annotations

import json

import pytest

from tests.helpers import configure


def write_scenario(path, **scenario):
    path.write_text(json.dumps(scenario))
    return path


def script_installation(tmp_path, forge, monkeypatch, extra: str, **scenario):
    """The sandbox forge's configuration with the script provider playing SCENARIO (in
    tmp_path/scenario.json), and EXTRA (TOML tables) after it; its path."""
    config = configure(tmp_path, forge, monkeypatch)
    write_scenario(tmp_path / "scenario.json", **scenario)
    config.write_text(
        '\nproviders = ["script"]\n[provider_options.script]\nscenario = "scenario.json"\n'
        + config.read_text()
        + extra
    )
    return config


@pytest.fixture
def claimed(forge, upgraded, tmp_path, monkeypatch, cli):
    config = configure(tmp_path, forge, monkeypatch)

    def setup(extra_config: str, **scenario):
        write_scenario(tmp_path / "scenario.json", **scenario)
        config.write_text(extra_config + "\n" + config.read_text())
        assert cli("poll").exit_code == 0
        claim = cli("--json", "claim", "--slot", "1").json()
        assert claim["claimed"], claim
        return claim["task"]

    return setup
