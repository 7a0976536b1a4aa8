"""One guest's life: a fresh overlay of the image, QEMU (restored from the image's saved
state when it has one, else a cold boot), SSH with the pinned host key, the clock set
from the host and a fresh identity, then power-off and removal of the overlay.

A guest's directory (run/NAME/guest.json) names its QEMU pid, its owner's pid and its
image, so `qemu list` shows who owns it and `sweep_guests` removes what a killed owner
left (QEMU itself dies with the thread that started it, unless detached).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from aiworker.runtime.guests.images import Image, ImageStore, RunningGuest
from aiworker.runtime.guests.machine import MachineSpec, create_overlay, qemu_argv
from aiworker.runtime.guests.qmp import Qmp, QmpError
from aiworker.runtime.guests.ssh import GuestShell, GuestUnreachable
from aiworker.runtime.processes import (
    process_alive,
    runs_with_arguments,
    spawn_detached,
    spawn_tied,
)

STOP_GRACE_S = 5.0
# Longest a guest may stay without a QEMU pid (an overlay being made) before a sweep.
STARTING_S = 600


@dataclass(frozen=True)
class StartOptions:
    purpose: str  # "implementation", "ci", "operator", ...
    proxy_port: int
    machine: MachineSpec = field(default_factory=MachineSpec)
    model_target: str | None = None  # host:port of a local model server
    detached: bool = False  # an operator's guest outlives the command that booted it
    restore: bool = True  # from the saved state when the image has one
    boot_deadline_s: float = 180.0
    # Provisioning: boot cold with the overlay at this path (the image's warm.qcow2,
    # kept with the saved state), not in the guest's directory.
    overlay: Path | None = None


class Guest:
    def __init__(self, store: ImageStore, image: Image, name: str) -> None:
        self.store = store
        self.image = image
        self.name = name
        self.path = store.run_dir / name
        self.process: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        self.qmp: Qmp | None = None
        self.shell: GuestShell | None = None
        self.port: int | None = None
        self.restored = False

    @classmethod
    def start(cls, store: ImageStore, image: Image, options: StartOptions) -> Guest:
        store.ensure()
        guest = cls(store, image, f"{options.purpose[:12]}-{secrets.token_hex(4)}")
        try:
            guest._boot(options)
        except BaseException:
            guest.stop()
            raise
        return guest

    def _boot(self, options: StartOptions) -> None:
        deadline = time.monotonic() + options.boot_deadline_s
        self.path.mkdir(mode=0o700)
        # A saved state loads only into the machine it was saved from.
        restore = (
            options.restore
            and options.overlay is None
            and self.image.restorable
            and self.image.saved_machine() == asdict(options.machine)
        )
        if restore:
            backing = self.image.warm
        else:  # provisioning makes its warm disk from the base
            backing = self.image.base if options.overlay else self.image.cold_disk
        overlay = options.overlay or self.path / "overlay.qcow2"
        self._record(options)  # before the overlay: pruning sees the image is in use
        failed = create_overlay(backing, overlay)
        if failed is not None:
            raise GuestUnreachable(failed)
        argv = qemu_argv(
            self.image,
            overlay,
            self.path,
            options.machine,
            proxy_port=options.proxy_port,
            model_target=options.model_target,
            incoming=self.image.state if restore else None,
        )
        if options.detached:
            self.pid = spawn_detached(argv, log_path=self.path / "qemu.log", cwd=self.path)
        else:
            self.process = spawn_tied(argv, cwd=self.path, log_path=self.path / "qemu.log")
            self.pid = self.process.pid
        self._record(options)
        try:
            self._connect(options, restore, deadline)
        except (OSError, QmpError, GuestUnreachable) as exc:
            if self._exited(within=2.0):
                raise GuestUnreachable(f"QEMU exited: {self._log_tail()}") from exc
            if isinstance(exc, GuestUnreachable):
                raise
            raise GuestUnreachable(f"the guest did not come up: {exc}") from exc

    def _connect(self, options: StartOptions, restore: bool, deadline: float) -> None:
        pid = self.pid
        self.qmp = Qmp(
            self.path / "qmp.sock", deadline, alive=lambda: pid is not None and process_alive(pid)
        )
        if restore:
            self.qmp.wait_status("paused", deadline)
            self.qmp.execute("cont")
            self.restored = True
        self.port = self.qmp.ssh_port()
        self._record(options)
        self.shell = GuestShell.connect(
            self.port,
            self.image.host_key,
            self.image.client_key,
            deadline,
            alive=lambda: pid is not None and process_alive(pid),
        )
        self.refresh_identity()

    def reconnect(self, deadline_s: float = 60) -> GuestShell:
        """A new login (the pinned host key) after the connection broke; the guest is
        the same one, with what it had."""
        pid, port = self.pid, self.port
        if port is None:
            raise GuestUnreachable("the guest has no SSH port")
        if self.shell is not None:
            with contextlib.suppress(Exception):
                self.shell.close()
        self.shell = GuestShell.connect(
            port,
            self.image.host_key,
            self.image.client_key,
            time.monotonic() + deadline_s,
            alive=lambda: pid is not None and process_alive(pid),
        )
        return self.shell

    def _record(self, options: StartOptions) -> None:
        record = {
            "name": self.name,
            "image": self.image.name,
            "layer": self.image.layer,
            "pid": self.pid,
            "owner_pid": None if options.detached else os.getpid(),
            "starter_pid": os.getpid(),
            "purpose": options.purpose,
            "port": self.port,
            "accel": options.machine.accel,
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        temporary = self.path / "guest.json.tmp"
        temporary.write_text(json.dumps(record))
        os.replace(temporary, self.path / "guest.json")

    def _exited(self, within: float) -> bool:
        """Whether QEMU has exited (given WITHIN seconds: a broken monitor connection
        comes a moment before the process is gone)."""
        if self.process is not None:
            try:
                self.process.wait(within)
            except subprocess.TimeoutExpired:
                return False
            return True
        end = time.monotonic() + within
        while self.pid is not None and process_alive(self.pid):
            if time.monotonic() > end:
                return False
            time.sleep(0.05)
        return True

    def _log_tail(self) -> str:
        try:
            text = (self.path / "qemu.log").read_text(errors="replace").strip()
        except OSError:
            text = ""
        return text[-300:] or "no message"

    def refresh_identity(self) -> None:
        """The host's clock, a new machine id and new entropy: a restored clone shares
        the saved guest's (stale) clock, machine id and random state."""
        assert self.shell is not None
        seed = secrets.token_hex(64)
        self.shell.check(
            f"date -s @{time.time():.3f} >/dev/null && "
            f"echo {secrets.token_hex(16)} > /etc/machine-id && "
            f"echo {seed} > /dev/urandom",
            timeout=30,
        )

    def save_state(self, target: Path, deadline_s: float = 120) -> None:
        """Save the running guest's state to TARGET (for restores) and stop it there."""
        assert self.shell is not None
        assert self.qmp is not None
        deadline = time.monotonic() + deadline_s
        # Freed pages are zero (init_on_free): dropping the caches shrinks the state.
        self.shell.check("sync && echo 3 > /proc/sys/vm/drop_caches", timeout=60)
        self.qmp.execute("stop")
        self.qmp.execute("migrate", uri=f"exec:cat > {shlex.quote(str(target))}")
        while True:
            status = self.qmp.execute("query-migrate").get("status")
            if status == "completed":
                break
            if status == "failed" or time.monotonic() > deadline:
                raise QmpError(f"saving the guest state ended {status}")
            time.sleep(0.05)
        os.chmod(target, 0o600)

    def stop(self) -> None:
        """Power off (QMP quit; the overlay is discarded, nothing to flush), SIGKILL
        after a grace, and remove the guest's directory. Safe to call twice."""
        if self.shell is not None:
            self.shell.close()
            self.shell = None
        if self.qmp is not None:
            with contextlib.suppress(OSError, QmpError, ValueError):
                self.qmp.execute("quit")
            with contextlib.suppress(OSError):
                self.qmp.close()
            self.qmp = None
        self._wait_or_kill()
        shutil.rmtree(self.path, ignore_errors=True)

    def _wait_or_kill(self) -> None:
        if self.process is not None:
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            return
        if self.pid is not None:
            end = time.monotonic() + STOP_GRACE_S
            while process_alive(self.pid) and time.monotonic() < end:
                time.sleep(0.05)
            kill_guest_process(self.pid, self.path)


def kill_guest_process(pid: int, path: Path) -> None:
    """SIGKILL PID only while it is still QEMU running the guest at PATH (pids are reused)."""
    if runs_with_arguments(pid, "-name", f"aiworker-{path.name}"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def sweep_guests(store: ImageStore) -> list[str]:
    """Remove guests whose owner is gone (a killed job): kill their QEMU if it still runs,
    remove their overlay. Operator guests (no owner) go once their QEMU has exited."""
    removed = []
    for guest in store.guests():
        try:
            age = time.time() - guest.path.stat().st_mtime
        except FileNotFoundError:
            continue  # its owner removed it just now
        if not _abandoned(guest, fresh=age < 60, starting=age < STARTING_S):
            continue
        pid = guest.record.get("pid")
        if isinstance(pid, int):
            kill_guest_process(pid, guest.path)
        shutil.rmtree(guest.path, ignore_errors=True)
        removed.append(guest.name)
    return removed


def _abandoned(guest: RunningGuest, *, fresh: bool, starting: bool) -> bool:
    """Whether nobody will stop GUEST any more. A guest whose QEMU is not spawned yet
    (its overlay being made) belongs to the process starting it while that runs, for
    at most STARTING_S (a pid may be reused); an owned guest whose QEMU has exited is
    its live owner's to remove, unless its folder is older than a minute."""
    record = guest.record
    if not record:
        return not fresh  # the folder exists, its record comes next
    if record.get("pid") is None:
        starter = record.get("starter_pid")
        return not (starting and isinstance(starter, int) and process_alive(starter))
    if guest.alive:
        return not guest.owner_alive
    return record.get("owner_pid") is None or not guest.owner_alive or not fresh
