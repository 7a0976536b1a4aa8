"""A guest image for the QEMU tests, provisioned once per recipe (by whichever test
process gets there first, under a file lock) with `aiworker qemu provision`, and a
private guests folder per test that shares it (its own running guests and egress log).

Without root, QEMU or mmdebstrap the QEMU tests are skipped, except under CI, where
`.ci/run` installs them and a missing tool is a failure."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.json_keys import assert_keys

REPO = Path(__file__).resolve().parent.parent
TOOLS = ("qemu-system-x86_64", "qemu-img", "socat", "mmdebstrap", "mkfs.ext4")


def _recipe_digest() -> str:
    digest = hashlib.sha256()
    # The recipe, and the machine a saved state belongs to.
    machine = REPO / "aiworker" / "runtime" / "guests" / "machine.py"
    for path in [*sorted((REPO / "guest-image").rglob("*")), machine]:
        if path.is_file():
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def _require_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    why = f"needs {', '.join(missing)}" if missing else ("needs root" if os.geteuid() else "")
    if why and os.environ.get("CI"):
        pytest.fail(f"the QEMU tests {why}; .ci/run installs them")
    if why:
        pytest.skip(f"the QEMU tests {why}")


@pytest.fixture(scope="session")
def shared_image() -> Path:
    """The current image folder of the shared test store."""
    _require_tools()
    return provision_shared_image()


def provision_shared_image() -> Path:
    """Provision the shared test image unless it is there (whoever comes first, under a
    file lock); its current image folder. `.ci/run` calls this (python -m
    tests.guest_fixtures) beside llama-server's build, before the tests."""
    root = REPO / ".cache" / f"guest-test-{_recipe_digest()}"
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = root / "state" / "guests" / "current"
        if not current.exists():
            config = root / "config.toml"
            config.write_text("")
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "aiworker",
                    "--config",
                    str(config),
                    "--state-dir",
                    str(root / "state"),
                    "--json",
                    "qemu",
                    "provision",
                ],
                capture_output=True,
                text=True,
                timeout=1800,
                check=False,
            )
            assert done.returncode == 0, done.stderr[-3000:]
            assert_keys("qemu provision", json.loads(done.stdout))
        return current.resolve()


@pytest.fixture
def guests_dir(shared_image: Path, tmp_path: Path) -> Path:
    """A guests folder of this test's own, whose current image is the shared one."""
    root = tmp_path / "guests"
    (root / "images").mkdir(parents=True)
    (root / "images" / shared_image.name).symlink_to(shared_image)
    (root / "current").symlink_to(Path("images") / shared_image.name)
    return root


if __name__ == "__main__":
    print(provision_shared_image())
