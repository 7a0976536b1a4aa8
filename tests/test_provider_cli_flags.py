"""Every flag aiworker passes to codex, claude and opencode exists in the real CLI's --help.

The CLIs come from the npm registry (tests/provider_clis.py); without npm the test is
skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from aiworker.adapters.providers.base import RunRequest
from aiworker.adapters.providers.claude import ClaudeProvider
from aiworker.adapters.providers.codex import CodexProvider
from aiworker.adapters.providers.opencode import llama_opencode_config, opencode_command

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed"),
]


def help_text(binary: Path, *args: str, home: Path) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}
    done = subprocess.run(
        [str(binary), *args, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    return done.stdout + done.stderr


def flags_of(argv: list[str]) -> set[str]:
    return {a for a in argv if re.fullmatch(r"--?[A-Za-z][\w-]*", a)}


def assert_documented(flags: set[str], text: str) -> None:
    missing = [f for f in sorted(flags) if not re.search(rf"(^|[\s,]){re.escape(f)}\b", text, re.M)]
    assert missing == [], f"flags not in --help: {missing}"


def test_codex_exec_flags(bin_dir, tmp_path):
    spec = CodexProvider(tmp_path).command(
        RunRequest("implementation", "gpt-5-codex", "high", tmp_path, tmp_path / "schema.json", "x")
    )
    assert_documented(flags_of(spec.argv), help_text(bin_dir / "codex", "exec", home=tmp_path))


def test_claude_flags(bin_dir, tmp_path):
    spec = ClaudeProvider(tmp_path / ".claude").command(
        RunRequest("review", "claude-sonnet-4", "high", tmp_path, tmp_path / "schema.json", "x")
    )
    assert_documented(flags_of(spec.argv), help_text(bin_dir / "claude", home=tmp_path))


def test_opencode_run_flags(bin_dir, tmp_path):
    spec = opencode_command(
        tmp_path,
        "llamacpp/gemma",
        tmp_path,
        "x",
        llama_opencode_config("http://127.0.0.1:9931", "gemma"),
    )
    assert_documented(flags_of(spec.argv), help_text(bin_dir / "opencode", "run", home=tmp_path))
