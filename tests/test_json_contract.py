"""With --json, stdout holds exactly one JSON document, on success and on failure."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_process

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
