"""Is KVM usable for stock guests here? A static check under a millisecond.

Some hosts expose a paravirtual /dev/kvm (PVM) on which stock guest kernels
hang; those are recognised by the kvm_pvm module or missing vmx/svm flags.
The boot probe that confirms KVM on a real guest lives with the qemu backend.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AccelVerdict:
    kvm: bool
    reason: str


def kvm_static_verdict(root: Path = Path("/")) -> AccelVerdict:
    device = root / "dev" / "kvm"
    if not device.exists():
        return AccelVerdict(False, "/dev/kvm does not exist")
    if (root / "sys" / "module" / "kvm_pvm").exists():
        return AccelVerdict(False, "/dev/kvm is the paravirtual PVM variant; stock guests hang")
    try:
        cpuinfo = (root / "proc" / "cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return AccelVerdict(False, "cannot read /proc/cpuinfo")
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    if not flags & {"vmx", "svm"}:
        return AccelVerdict(False, "the CPU exposes neither vmx nor svm")
    if not os.access(device, os.R_OK | os.W_OK):
        return AccelVerdict(False, "/dev/kvm is not readable and writable by this user")
    return AccelVerdict(True, "static checks pass; a boot probe confirms before use")
