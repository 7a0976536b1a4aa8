"""Long work shows its progress: `qemu provision` prints its stages as they begin (plain
lines when stderr is no terminal, nothing under --json) and writes the build's output to
its log as it comes, so `tail -f` follows it; a failed build names that log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

RECIPE = """#!/bin/bash
echo "unpacking the base system"
while [ ! -e {marker} ]; do sleep 0.1; done
echo "configuring systemd" >&2
exit 3
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="provisioning runs as root")
@pytest.mark.parametrize("json_mode", [False, True], ids=["plain", "json"])
def test_provision_streams_its_build_log_and_shows_its_stages(
    upgraded, state_dir, tmp_path, json_mode
):
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    marker = tmp_path / "go-on"
    (recipe / "build.sh").write_text(RECIPE.format(marker=marker))
    argv = [sys.executable, "-m", "aiworker", *(["--json"] if json_mode else [])]
    process = subprocess.Popen(
        [*argv, "qemu", "provision", "--recipe", str(recipe)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        images = state_dir / "guests" / "images"
        deadline = time.monotonic() + 60
        logs = []
        while time.monotonic() < deadline:
            logs = list(images.glob(".*.build.log")) if images.is_dir() else []
            if logs and "unpacking the base system" in logs[0].read_text():
                break
            time.sleep(0.1)
        # Written as it came: the build is still running, waiting for the marker.
        assert logs, "no build log appeared"
        assert "unpacking the base system" in logs[0].read_text()
        assert process.poll() is None
        marker.touch()
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1, (out, err)
    assert logs[0].read_text() == "unpacking the base system\nconfiguring systemd\n"
    if json_mode:
        assert err == ""
        message = json.loads(out)["error"]["message"]
    else:
        assert f"building the image from {recipe} (its output, as it comes: {logs[0]})" in err
        message = err
    assert f"the image recipe failed (exit 3; its output is in {logs[0]})" in message
    assert "configuring systemd" in message
