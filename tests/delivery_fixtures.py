"""A claimed task on the sandbox forge, configured for the script provider."""

from __future__ import annotations

import json

import pytest

from tests.helpers import configure


def write_scenario(path, **scenario):
    path.write_text(json.dumps(scenario))
    return path


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
