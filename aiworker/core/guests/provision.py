"""`aiworker qemu provision`: build a new guest image and make it current.

Under the maintenance gate (ticks start nothing while it is held): wait for running
jobs to finish or refuse (exit 75); build with the recipe into a new image folder
(a new host key and control key, generated here; the guest's private host key exists
only inside the image); boot it cold, log in over SSH, save its state for fast starts;
only then switch `current`, and remove images nothing uses any more. A failed build
removes its own folder and leaves `current` as it was.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.guests.backends import guest_store, missing_tools
from aiworker.core.guests.paths import for_the_owner
from aiworker.core.progress import Stages, quiet
from aiworker.core.report import Report
from aiworker.errors import AiworkerError, Interrupted, InvalidInput, Unavailable
from aiworker.runtime.guests.egress import DecisionLog, EgressPolicy, EgressProxy
from aiworker.runtime.guests.guest import Guest, StartOptions
from aiworker.runtime.guests.images import Image, ImageStore
from aiworker.runtime.guests.keys import new_key_pair
from aiworker.runtime.guests.machine import MachineSpec
from aiworker.runtime.guests.probe import choose_accel
from aiworker.runtime.guests.ssh import GuestShell
from aiworker.runtime.logged import run_logged
from aiworker.runtime.mounts import detach_mounts_below
from aiworker.runtime.processes import which

BUILD_TIMEOUT_S = 3600

log = logging.getLogger(__name__)


@dataclass
class ProvisionReport(Report):
    image: str
    path: str
    accel: str
    accel_reason: str
    build_s: float
    cold_boot_s: float
    saved_state: bool
    previous: str | None
    removed: list[str] = field(default_factory=list)
    files: dict[str, Any] = field(default_factory=dict)


def recipe_dir() -> Path:
    """Inside a wheel the recipe ships as aiworker/_guest_image; in a checkout, at the top."""
    package = Path(__file__).resolve().parents[2]
    packaged = package / "_guest_image"
    return packaged if packaged.is_dir() else package.parent / "guest-image"


def provision(
    env: Environment,
    *,
    wait_s: float = 0,
    recipe: Path | None = None,
    save_state: bool = True,
    stages: Stages = quiet,
) -> ProvisionReport:
    """Build, boot and publish a new image; STAGES hears each stage as it begins (and,
    as passing detail, each line the build prints)."""
    checked_wait(wait_s)
    recipe = recipe or recipe_dir()
    if not (recipe / "build.sh").is_file():
        raise InvalidInput(f"no image recipe at {recipe} (build.sh missing); give --recipe")
    missing = [t for t in (*missing_tools(), "mmdebstrap", "mkfs.ext4") if which(t) is None]
    if missing:
        raise Unavailable(f"provisioning needs {', '.join(missing)}: install them first")
    if os.geteuid() != 0:
        raise InvalidInput("provisioning builds the root filesystem as root; run it as root")
    with for_the_owner(env):
        maintenance = env.locks.maintenance()
        try:
            wait_for_jobs(env, guest_store(env), wait_s)
            return _provision(env, recipe, save_state, stages)
        finally:
            maintenance.release()


def running_jobs(env: Environment, store: ImageStore) -> list[str]:
    """Slots whose job runs, and guests a live job owns."""
    busy = [
        f"slot {n}" for n in range(1, env.loaded.config.shares + 1) if env.locks.slot(n).is_locked()
    ]
    guests = [g for g in store.guests() if g.record.get("owner_pid") and g.owner_alive]
    return busy + [f"guest {g.name}" for g in guests]


def checked_wait(wait_s: float) -> None:
    """Refuse a --wait that is no number of seconds: nan passes every range check, and
    would hold maintenance.lock for ever once a job runs."""
    if not math.isfinite(wait_s):
        raise InvalidInput(f"--wait {wait_s}: a number of seconds")


def wait_for_jobs(env: Environment, store: ImageStore, wait_s: float) -> None:
    end = time.monotonic() + wait_s
    while busy := running_jobs(env, store):
        if time.monotonic() >= end:
            raise Unavailable(
                f"jobs are running ({', '.join(busy)}); provisioning waits for them with "
                "--wait SECONDS, or try again later"
            )
        time.sleep(1)


def _provision(env: Environment, recipe: Path, save_state: bool, stages: Stages) -> ProvisionReport:
    store = guest_store(env)
    execution = env.loaded.config.execution
    path = store.new_image_dir()
    image = Image(path)
    try:
        started = time.monotonic()
        _build(recipe, path, execution, stages)
        build_s = time.monotonic() - started
        stages("probing the accelerator")
        choice = choose_accel(image)
        machine = MachineSpec(execution.memory_mib, execution.cpus, choice.accel)
        stages(f"booting the image cold ({choice.accel}) and saving its booted state")
        boot_s = boot_and_save(store, image, machine, execution.boot_deadline_s, save_state)
        stages("recording the image's digests")
        files = _record(image, machine, choice.accel)
    except BaseException:
        _discard(path)
        raise
    previous = store.current()
    store.publish(image)
    return ProvisionReport(
        image=image.name,
        path=str(path),
        accel=choice.accel,
        accel_reason=choice.reason,
        build_s=round(build_s, 1),
        cold_boot_s=round(boot_s, 1),
        saved_state=image.restorable,
        previous=previous.name if previous else None,
        removed=store.prune(),
        files=files,
    )


def _discard(path: Path) -> None:
    """Remove what a failed or stopped build left in PATH; a file system it left mounted
    in there (the host's /dev, say) is detached first, never emptied."""
    stuck = detach_mounts_below(path)
    if stuck:
        log.error("not removing %s: %s stay mounted in it", path, ", ".join(map(str, stuck)))
        return
    shutil.rmtree(path, ignore_errors=True)


def _build(recipe: Path, path: Path, execution: Any, stages: Stages) -> None:
    keys = Path(tempfile.mkdtemp(prefix="aiworker-keys-"))
    try:
        host_pub = new_key_pair(keys / "host_key", "aiworker-guest")
        new_key_pair(keys / "client_key", "aiworker-control")
        build_log = path.parent / f".{path.name}.build.log"
        stages(f"building the image from {recipe} (its output, as it comes: {build_log})")
        try:
            done = run_logged(
                ["bash", str(recipe / "build.sh")],
                env={
                    "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                    "OUT": str(path),
                    "HOST_KEY": str(keys / "host_key"),
                    "CLIENT_KEY_PUB": str(keys / "client_key.pub"),
                    "SUITE": execution.suite,
                    "MIRROR": execution.mirror,
                    "DISK_SIZE": execution.disk_size,
                    "EXTRA_PACKAGES": " ".join(execution.extra_packages),
                    "LANG": "C.UTF-8",
                },
                log_path=build_log,
                timeout=BUILD_TIMEOUT_S,
                on_line=lambda line: stages(line, passing=True),
            )
        except Interrupted:  # stopped: nothing names its log
            build_log.unlink(missing_ok=True)
            raise
        if not done.ok:
            how = "timed out" if done.exit_code is None else f"exit {done.exit_code}"
            raise AiworkerError(
                f"the image recipe failed ({how}; its output is in {build_log}): {done.tail[-600:]}"
            )
        build_log.unlink()
        (path / "host_key.pub").write_text(host_pub + "\n")
        shutil.move(keys / "client_key", path / "client_key")
        shutil.move(keys / "client_key.pub", path / "client_key.pub")
    finally:
        shutil.rmtree(keys, ignore_errors=True)


def boot_and_save(
    store: ImageStore,
    image: Image,
    machine: MachineSpec,
    deadline_s: float,
    save: bool,
    prepare: Callable[[GuestShell], None] | None = None,
    policy: EgressPolicy | None = None,
) -> float:
    """Boot IMAGE cold and log in (it must answer SSH to become current), run PREPARE
    in it (a cache layer's script, with POLICY's egress), and keep the booted guest's
    disk (warm.qcow2) and state (state.bin) for restores."""
    proxy = EgressProxy(policy or EgressPolicy(), DecisionLog(None, "provision"))
    started = time.monotonic()
    options = StartOptions(
        "provision",
        proxy.port,
        machine,
        restore=False,
        boot_deadline_s=deadline_s,
        overlay=image.warm,
    )
    try:
        guest = Guest.start(store, image, options)
    except BaseException:
        proxy.close()
        raise
    try:
        boot_s = time.monotonic() - started
        assert guest.shell is not None
        guest.shell.check("id dev && git --version && python3 --version", timeout=60)
        if prepare is not None:
            prepare(guest.shell)
        # The warm disk keeps what the first boot wrote; each clone gets its own id.
        guest.shell.check(": > /etc/machine-id", timeout=30)
        if save:
            guest.save_state(image.state)
    finally:
        guest.stop()
        proxy.close()
    if not save:
        image.warm.unlink(missing_ok=True)
    return boot_s


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _record(image: Image, machine: MachineSpec, accel: str) -> dict[str, Any]:
    """The manifest gains what provisioning produced: digests of every file, the machine
    the saved state belongs to, the accelerator."""
    manifest = image.manifest()
    for name in ("host_key.pub", "warm.qcow2", "state.bin"):
        path = image.path / name
        if path.is_file():
            manifest["files"][name] = {"sha256": sha256_of(path), "bytes": path.stat().st_size}
    manifest["machine"] = asdict(machine)
    manifest["accel"] = accel
    temporary = image.path / "manifest.json.tmp"
    temporary.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(temporary, image.path / "manifest.json")
    files: dict[str, Any] = manifest["files"]
    return files
