"""The command-line surface: help, version, exit codes and the one error handler."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

from aiworker import __version__
from tests.helpers import run_process


def test_help_lists_every_group(cli):
    result = cli("--help")
    assert result.exit_code == 0, result
    for group in ("config", "db", "status", "doctor"):
        assert f"  {group} " in result.stdout


def test_version(cli):
    result = cli("--version")
    assert result.exit_code == 0, result
    assert result.stdout == f"aiworker {__version__}\n"


def test_help_imports_no_heavy_modules():
    code = (
        "import sys, io, contextlib\n"
        "from aiworker.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--help'])\n"
        "heavy = [m for m in ('sqlalchemy', 'paramiko', 'alembic', 'requests', 'rich.console')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_unknown_command_is_usage_error(cli):
    result = cli("frobnicate")
    assert result.exit_code == 2, result
    assert "No such command 'frobnicate'" in result.stderr
    assert result.stdout == ""


def test_usage_error_in_json_mode_is_one_json_document(cli):
    result = cli("--json", "db", "backup")
    assert result.exit_code == 2, result
    document = result.json()
    assert document["error"]["code"] == "usage"
    assert "--to" in document["error"]["message"]


def headless_database(state_dir):
    """A SQLite file at this version's revision whose tables are gone: no check foresees
    that, so reading it is an unexpected error."""
    from aiworker.store.schema import HEAD_REVISION

    state_dir.mkdir(parents=True)
    conn = sqlite3.connect(state_dir / "aiworker.db")
    with conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        conn.execute("INSERT INTO alembic_version VALUES (?)", (HEAD_REVISION,))
    conn.close()


def test_unexpected_error_is_one_line_with_hint(state_dir):
    headless_database(state_dir)
    result = run_process("status")
    assert result.exit_code == 1, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result
    assert "rerun with -v" in lines[0]
    verbose = run_process("-v", "status")
    assert verbose.exit_code == 1
    assert "Traceback" in verbose.stderr


def test_unexpected_error_with_json_is_json(state_dir):
    headless_database(state_dir)
    result = run_process("--json", "status")
    assert result.exit_code == 1, result
    assert json.loads(result.stdout)["error"]["code"] == "internal"
