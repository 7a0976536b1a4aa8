"""With --json, stdout holds exactly one JSON document, on success and on failure."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_process
from tests.json_keys import KEYS, assert_keys
from tests.test_docs_and_layers import leaf_commands

CASES = [
    ("status",),
    ("doctor",),
    ("config", "show"),
    ("config", "validate"),
    ("db", "current"),
    ("db", "upgrade"),
    ("db", "backup", "--to", "relative.db"),  # fails: exit 2
    ("db", "frobnicate"),  # usage error
    ("config", "set", "shares", "99"),  # invalid value
]


@pytest.mark.parametrize("args", CASES, ids=" ".join)
def test_stdout_is_one_json_document(args, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("shares = 1\n")
    result = run_process("--json", "--config", str(config), *args)
    document = json.loads(result.stdout)  # raises if there is more than one document
    assert result.stdout.count("\n") == 1
    if result.exit_code == 0:
        assert "error" not in document
    else:
        assert set(document) == {"error"}
        assert {"code", "message"} <= set(document["error"])
        assert result.exit_code in (1, 2, 75)


def test_every_command_pins_its_success_keys():
    commands = {" ".join(path) for path, _ in leaf_commands()}
    assert commands == set(KEYS), (
        f"unpinned: {sorted(commands - set(KEYS))}, stale: {sorted(set(KEYS) - commands)}"
    )


# Commands that run on a fresh state directory; the others are pinned where their own
# tests run them against the sandbox forge (delivery, lifecycle, scheduler, config).
FRESH = {
    "db upgrade": ("db", "upgrade"),
    "db current": ("db", "current"),
    "status": ("status",),
    "doctor": ("doctor",),
    "config show": ("config", "show"),
    "config validate": ("config", "validate"),
    "config set": ("config", "set", "shares", "2"),
    "scheduler status": ("scheduler", "status"),
    "scheduler pause": ("scheduler", "pause"),
    "scheduler resume": ("scheduler", "resume"),
    "scheduler tick": ("scheduler", "tick"),
    "task list": ("task", "list"),
    "providers status": ("providers", "status"),
    "cleanup": ("cleanup",),
    "qemu list": ("qemu", "list"),
}


def test_success_documents_carry_exactly_their_pinned_keys(cli, tmp_path, monkeypatch):
    config = tmp_path / "config.toml"
    config.write_text("shares = 1\n")
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))
    for command, args in FRESH.items():
        result = cli("--json", *args)
        # doctor reports failing checks (no qemu here) with exit 1 and the same document
        assert result.exit_code == 0 or command == "doctor", (command, result)
        assert_keys(command, result.json())
    backup = cli("--json", "db", "backup", "--to", str(tmp_path / "copy.db"))
    assert_keys("db backup", backup.json())
    units = cli("--json", "scheduler", "install", "--dir", str(tmp_path / "units"))
    assert_keys("scheduler install", units.json())
    seeded = cli("--json", "sandbox", "seed", "--data", str(tmp_path / "forge"))
    assert_keys("sandbox seed", seeded.json())
