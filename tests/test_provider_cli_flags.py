"""Every flag aiworker passes to codex, claude and opencode exists in the real CLI's --help.

The CLIs come from the npm registry at the versions the reference describes and
are installed once into .venv/npm-providers; without npm the test is skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from aiworker.adapters.providers.claude import ClaudeProvider
from aiworker.adapters.providers.codex import CodexProvider
from aiworker.adapters.providers.opencode import llama_opencode_config, opencode_command

ROOT = Path(__file__).resolve().parent.parent
PREFIX = ROOT / ".venv" / "npm-providers"
PACKAGES = ("@openai/codex@0.171.0", "@anthropic-ai/claude-code@2.1.332", "opencode-ai@1.18.33")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed"),
]


@pytest.fixture(scope="module")
def bin_dir():
    marker = PREFIX / ".installed"
    if not marker.exists() or marker.read_text() != " ".join(PACKAGES):
        done = subprocess.run(
            ["npm", "install", "--prefix", str(PREFIX), "--no-audit", "--no-fund", *PACKAGES],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"npm could not install the CLIs: {done.stderr.strip()[-300:]}")
        marker.write_text(" ".join(PACKAGES))
    return PREFIX / "node_modules" / ".bin"


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
        "implementation", "gpt-5-codex", "high", tmp_path, tmp_path / "schema.json", "x"
    )
    assert_documented(flags_of(spec.argv), help_text(bin_dir / "codex", "exec", home=tmp_path))


def test_claude_flags(bin_dir, tmp_path):
    spec = ClaudeProvider(tmp_path / ".claude").command(
        "review", "claude-sonnet-4", "high", tmp_path, tmp_path / "schema.json", "x"
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
