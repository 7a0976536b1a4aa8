"""`runner doctor`: whether this host can serve the controller, without claiming
anything: the controller answers and accepts the token, offers the contract, its clock
agrees; the attempt root is usable, with room; a job gets a cgroup of its own; a job
could not read the runner's token."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from aiworker.core.health import Check, HealthReport
from aiworker.core.runner.controllers import Controller
from aiworker.errors import AiworkerError
from aiworker.runtime.attempts import ensure_private_root
from aiworker.runtime.cgroups import AttemptCgroup

MIN_FREE_BYTES = 1024**3


def doctor(controller: Controller, attempt_root: Path) -> HealthReport:
    """Reachability, the token, the contract, clock skew, and the attempt root; claims
    nothing. The same shape and words as the controller's `doctor`."""
    checks: list[Check] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append(Check(name, "ok" if ok else "fail", detail))

    try:
        document, offset = controller.health()
        check("controller", True, "reachable; the token is accepted")
        offered = document.get("contracts") or []
        check("contract", "ait.runner.native-job.v3" in offered, f"offered: {offered}")
        skew = abs(offset or 0.0)
        check("clock", skew < 30, f"{skew:.1f} s from the controller's clock")
    except AiworkerError as exc:
        check("controller", False, exc.message)
    except (ValueError, KeyError, TypeError, AttributeError):
        check("controller", False, "the answer is not the runner API's health document")
    check(*_attempt_root_check(attempt_root))
    checks.append(_containment_check())
    checks.append(_privilege_check())
    return HealthReport.of(checks)


CAP_SYS_PTRACE = 19


def _privilege_check() -> Check:
    """Whether a job could read this runner's token: one run by root with CAP_SYS_PTRACE
    is root too, and reads the runner's environment from /proc, undumpable or not."""
    try:
        status = Path("/proc/self/status").read_text(encoding="ascii")
        effective = int(
            next(ln.split()[1] for ln in status.splitlines() if ln.startswith("CapEff:")), 16
        )
    except (OSError, StopIteration, ValueError):
        effective = 0
    if os.geteuid() == 0 and effective >> CAP_SYS_PTRACE & 1:
        return Check(
            "privileges",
            "warn",
            "runs as root with CAP_SYS_PTRACE: its jobs run so too, and can read its token "
            "(masked in their evidence, but theirs to use); run it as its own user in its "
            "unit (`scheduler install --runner-server`)",
        )
    return Check("privileges", "ok", "its jobs cannot read its token from its process")


def _containment_check() -> Check:
    """Whether a job can get a cgroup of its own here: without one, a process it detached
    (setsid, a double fork) may outlive it (the subreaper catches only what stays below)."""
    made = AttemptCgroup.create()
    if made is None:
        return Check(
            "containment",
            "warn",
            "no cgroup can be made for a job here (cgroup2 is not mounted writable, or not "
            "delegated to this user): a process a job detaches (setsid, a double fork) may "
            "outlive it; run the runner in its unit (Delegate=yes)",
        )
    made.remove()
    return Check("containment", "ok", "each job runs in a cgroup of its own, killed whole")


def _attempt_root_check(root: Path) -> tuple[str, bool, str]:
    try:
        ensure_private_root(root)
        fd, probe = tempfile.mkstemp(dir=root, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
        free = shutil.disk_usage(root).free
    except OSError as exc:
        return "attempt_root", False, f"{root}: {exc.strerror or exc}"
    if free < MIN_FREE_BYTES:
        return "attempt_root", False, f"{root}: only {free // 1024**2} MiB free"
    return "attempt_root", True, f"{root}: writable, {free // 1024**3} GiB free"
