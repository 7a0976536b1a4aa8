"""Which accelerator a guest gets: KVM only where the static check passes and a real
boot of the image prints its kernel banner before the deadline; TCG otherwise. On a
paravirtual /dev/kvm a stock kernel hangs silently, so only a boot tells."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from aiworker.runtime.accel import kvm_static_verdict
from aiworker.runtime.guests.images import Image
from aiworker.runtime.guests.machine import MachineSpec, create_overlay, qemu_argv
from aiworker.runtime.processes import spawn_tied

PROBE_DEADLINE_S = 5.0


@dataclass(frozen=True)
class AccelChoice:
    accel: str  # "kvm" | "tcg"
    reason: str


def choose_accel(image: Image, deadline_s: float = PROBE_DEADLINE_S) -> AccelChoice:
    static = kvm_static_verdict()
    if not static.kvm:
        return AccelChoice("tcg", f"KVM unusable: {static.reason}")
    if _boots_under_kvm(image, deadline_s):
        return AccelChoice("kvm", "KVM: the image's kernel booted in the probe")
    return AccelChoice("tcg", f"KVM unusable: the kernel printed nothing within {deadline_s:g} s")


def _boots_under_kvm(image: Image, deadline_s: float) -> bool:
    run = Path(tempfile.mkdtemp(prefix="aiworker-kvm-probe-"))
    try:
        overlay = run / "overlay.qcow2"
        if create_overlay(image.base, overlay) is not None:
            return False
        argv = qemu_argv(
            image,
            overlay,
            run,
            MachineSpec(memory_mib=512, accel="kvm"),
            proxy_port=9,
            append="earlyprintk=serial,ttyS0",
        )
        process = spawn_tied(argv, cwd=run, log_path=run / "qemu.log")
        try:
            end = time.monotonic() + deadline_s
            console = run / "console.log"
            while time.monotonic() < end and process.poll() is None:
                if console.is_file() and b"Linux version" in console.read_bytes():
                    return True
                time.sleep(0.05)
            return False
        finally:
            process.kill()
            process.wait()
    finally:
        shutil.rmtree(run, ignore_errors=True)
