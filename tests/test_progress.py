"""Long work shows its progress: `qemu provision` prints its stages as they begin (plain
lines when stderr is no terminal, nothing under --json) and writes the build's output to
its log as it comes, so `tail -f` follows it; a failed build names that log."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import at_terminal, run_process
from tests.test_implement import FIX, SCRIPT_ONLY, result_doc

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


STOPPED_RECIPE = """#!/bin/bash
# Stopped, it cleans up and says much while it does (more than a pipe holds).
trap 'head -c 300000 /dev/zero | tr "\\0" x; echo; touch {cleaned}; exit 1' TERM
mkdir -p "$OUT/.rootfs/dev"
mount --bind {precious} "$OUT/.rootfs/dev"  # as a root-mode mmdebstrap mounts the host's
sleep 600 &
echo $! > {child}
echo "unpacking the base system"
wait
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)
def test_a_provision_stopped_by_sigterm_stops_its_build_and_leaves_nothing(
    upgraded, state_dir, tmp_path
):
    """`qemu provision` is stopped (an operator's Ctrl-C on `timeout`, systemd stopping
    it) while its build runs: the build is stopped with it, not left running unsupervised,
    and what it made goes (the image's folder, its log, the keys made for it), without
    descending into what the build left mounted there. In a mount namespace of its own."""
    recipe, precious, scratch = tmp_path / "recipe", tmp_path / "precious", tmp_path / "tmp"
    for folder in (recipe, precious, scratch):
        folder.mkdir()
    (precious / "null").write_text("the host's own\n")
    child = tmp_path / "child.pid"
    cleaned = tmp_path / "cleaned"
    script = STOPPED_RECIPE.format(precious=precious, child=child, cleaned=cleaned)
    (recipe / "build.sh").write_text(script)
    argv = [sys.executable, "-m", "aiworker", "--json", "qemu", "provision", "--recipe"]
    process = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", *argv, str(recipe)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    images = state_dir / "guests" / "images"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            logs = list(images.glob(".*.build.log")) if images.is_dir() else []
            if logs and "unpacking the base system" in logs[0].read_text():
                break
            time.sleep(0.1)
        assert child.exists(), "the build did not start"
        builder = int(child.read_text())
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 143, (out, err)
    assert json.loads(out)["error"]["message"] == "stopped by SIGTERM"
    assert gone(builder)  # the build's own process is stopped too
    assert cleaned.exists()  # its clean-up ran to its end, not cut off by a full pipe
    assert list(images.iterdir()) == []  # no image folder, no build log
    assert list(scratch.iterdir()) == []  # no keys left behind
    assert (precious / "null").read_text() == "the host's own\n"


DETACH = """
import os, subprocess, sys
from pathlib import Path
from aiworker.runtime.mounts import detach_mounts_below
host, image = Path(sys.argv[1]), Path(sys.argv[2])
def mount(*args):
    subprocess.run(["mount", *args], check=True)
mount("-t", "tmpfs", "none", str(host))
mount("--make-shared", str(host))
(host / "pts").mkdir()
mount("-t", "tmpfs", "none", str(host / "pts"))
(host / "pts" / "0").write_text("the host's own")
dev = image / ".rootfs" / "dev"
dev.mkdir(parents=True)
mount("--rbind", str(host), str(dev))  # as a build binds the host's /dev or /sys
assert os.path.ismount(dev / "pts")
print(detach_mounts_below(image), os.path.ismount(host / "pts"), (host / "pts" / "0").exists())
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)
def test_what_a_build_left_mounted_is_detached_without_unmounting_the_hosts(tmp_path):
    """A build's recursive bind of a shared tree of the host (its /dev with /dev/pts) is
    detached from the image folder, and the host's own mounts stay. In a mount namespace
    of its own."""
    host, image = tmp_path / "host", tmp_path / "image"
    host.mkdir()
    image.mkdir()
    argv = [sys.executable, "-c", DETACH, str(host), str(image)]
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "True", "True"]


def gone(pid: int) -> bool:
    """PID has ended: no such process, or one ended and not yet reaped by its parent."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(") ", 1)[1][0] == "Z"
    except FileNotFoundError:
        return True


def test_a_first_fetch_says_so_in_a_terminal_and_nothing_under_json(
    forge, claimed, upgraded, state_dir
):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc(), failure="transient")
    shown = at_terminal("implement", "--task", str(task), "--slot", "1")
    assert "aiworker: repository 1: a first fetch, of its whole history" in shown, shown
    assert "aiworker: repository 1: fetched into the cache" in shown
    # Again from an empty cache, with --json: stdout and stderr carry the report alone.
    assert run_process("--json", "claim", "--slot", "1").json()["claimed"]
    shutil.rmtree(state_dir / "git-cache")
    quiet = at_terminal("--json", "implement", "--task", str(task), "--slot", "1")
    assert "a first fetch" not in quiet
    assert json.loads(quiet)["task"] == task
