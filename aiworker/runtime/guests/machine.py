"""QEMU's command line for a guest, and starting it.

The device set is the same for a cold boot and a restore (a saved state loads only
into an identical machine): q35, virtio disk, network and entropy, a serial log, QMP.
Networking is restricted user mode: the guest reaches nothing but its guestfwd
addresses (the egress proxy at 10.0.2.100:3128, a model forwarder at 10.0.2.101:8080)
and is reached only through SSH forwarded from an ephemeral port on 127.0.0.1.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from aiworker.runtime.guests.images import Image
from aiworker.runtime.processes import run_command

PROXY_ADDRESS = "10.0.2.100"
PROXY_PORT = 3128
MODEL_ADDRESS = "10.0.2.101"
MODEL_PORT = 8080


@dataclass(frozen=True)
class MachineSpec:
    memory_mib: int = 1024
    cpus: int = 2
    accel: str = "tcg"  # or "kvm", as the image's probe found


def _forward(address: str, port: int, target: str) -> str:
    # One socat per guest connection (the `tcp:` form carries a single connection); a short
    # -t so a closed connection costs 50 ms, not socat's default half second.
    return f"guestfwd=tcp:{address}:{port}-cmd:socat -t 0.05 - TCP:{target}"


def qemu_argv(
    image: Image,
    overlay: Path,
    run: Path,
    spec: MachineSpec,
    *,
    proxy_port: int,
    model_target: str | None = None,
    incoming: Path | None = None,
    append: str = "",
) -> list[str]:
    accel = (
        ["-accel", "kvm", "-cpu", "host"]
        if spec.accel == "kvm"
        else [
            "-accel",
            "tcg,tb-size=64",  # the default 1 GiB translation cache costs ~500 MB and time
            "-cpu",
            "max",
        ]
    )
    netdev = ",".join(
        [
            "user,id=n0,restrict=on",
            "hostfwd=tcp:127.0.0.1:0-:22",
            _forward(PROXY_ADDRESS, PROXY_PORT, f"127.0.0.1:{proxy_port}"),
            *([_forward(MODEL_ADDRESS, MODEL_PORT, model_target)] if model_target else []),
        ]
    )
    kernel_line = image.manifest().get("append", "root=/dev/vda rw console=ttyS0 quiet")
    argv = [
        "qemu-system-x86_64",
        "-name",
        f"aiworker-{run.name}",
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-machine",
        "q35",
        *accel,
        "-smp",
        str(spec.cpus),
        "-m",
        str(spec.memory_mib),
        "-kernel",
        str(image.kernel),
        "-initrd",
        str(image.initrd),
        "-append",
        f"{kernel_line} {append}".strip(),
        "-drive",
        f"file={overlay},if=none,id=d0,format=qcow2",
        "-device",
        "virtio-blk-pci,drive=d0",
        "-netdev",
        netdev,
        "-device",
        "virtio-net-pci,netdev=n0",
        "-device",
        "virtio-rng-pci",
        # A new generation id on every start: the kernel reseeds its random state, so
        # clones restored from one saved state do not share it.
        "-device",
        "vmgenid,guid=auto",
        "-serial",
        f"file:{run / 'console.log'}",
        "-qmp",
        "unix:qmp.sock,server=on,wait=off",  # in QEMU's working directory, the guest's
    ]
    if incoming is not None:
        argv += ["-incoming", f"exec:cat {shlex.quote(str(incoming))}"]
    return argv


def create_overlay(backing: Path, overlay: Path) -> str | None:
    """A new qcow2 OVERLAY of BACKING (an absolute path: QEMU resolves a relative one
    from the overlay's folder); the error, or None."""
    made = run_command(
        [
            "qemu-img",
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            "qcow2",
            "-b",
            str(backing),
            str(overlay),
        ],
        timeout=30,
    )
    return None if made.ok else f"qemu-img create failed: {made.stderr.strip()[:300]}"
