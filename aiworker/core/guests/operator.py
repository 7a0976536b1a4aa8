"""The operator's view of guests: `qemu list | boot | ssh | stop`."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from aiworker.core.context import Environment
from aiworker.core.guests.backends import backend_choice, guest_store, require_image
from aiworker.core.report import Report
from aiworker.errors import InvalidInput
from aiworker.runtime.guests.guest import Guest, StartOptions, kill_guest_process, sweep_guests
from aiworker.runtime.guests.images import ImageStore, RunningGuest
from aiworker.runtime.guests.machine import MachineSpec
from aiworker.runtime.guests.qmp import Qmp, QmpError
from aiworker.runtime.guests.ssh import GuestShell
from aiworker.runtime.processes import process_alive, run_interactive, which

# An operator's guest reaches nothing: its proxy address leads to a closed port.
NO_PROXY_PORT = 9


@dataclass
class GuestList(Report):
    backend: str
    backend_reason: str
    current: str | None
    images: list[dict[str, Any]] = field(default_factory=list)
    guests: list[dict[str, Any]] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)


@dataclass
class BootReport(Report):
    name: str
    image: str
    port: int
    restored: bool
    seconds: float


@dataclass
class StopReport(Report):
    name: str
    stopped: bool


def _size(path: Any) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def inventory(env: Environment) -> GuestList:
    store = guest_store(env)
    swept = sweep_guests(store)
    current = store.current()
    guests = store.guests()
    images = []
    for image in store.images():
        manifest = image.manifest() if (image.path / "manifest.json").is_file() else {}
        images.append(
            {
                "name": image.name,
                "current": current is not None and image.name == current.name,
                "ready": bool(manifest.get("machine")),
                "age_s": round(image.age_s()) if manifest else None,
                "accel": manifest.get("accel"),
                "restorable": image.restorable,
                "layers": image.layers(),
                "bytes": _size(image.path),
                "used_by": [g.name for g in guests if g.record.get("image") == image.name],
            }
        )
    backend, reason = backend_choice(env)
    return GuestList(
        backend=backend,
        backend_reason=reason,
        current=current.name if current else None,
        images=images,
        guests=[_describe(g) for g in guests],
        swept=swept,
    )


def _describe(guest: RunningGuest) -> dict[str, Any]:
    record = guest.record
    owner = record.get("owner_pid")
    return {
        "name": guest.name,
        "image": record.get("image"),
        "purpose": record.get("purpose"),
        "pid": record.get("pid"),
        "alive": guest.alive,
        "owner_pid": owner,
        "owner": "operator" if owner is None else ("alive" if guest.owner_alive else "gone"),
        "port": record.get("port"),
        "accel": record.get("accel"),
        "started_at": record.get("started_at"),
        "overlay_bytes": _size(guest.path),
    }


def boot(env: Environment, *, cold: bool = False) -> BootReport:
    """A throwaway guest for an operator (COLD: booted, not restored); it runs until
    `qemu stop NAME`."""
    store, image = require_image(env)
    execution = env.loaded.config.execution
    machine = MachineSpec(execution.memory_mib, execution.cpus, str(image.manifest()["accel"]))
    started = time.monotonic()
    guest = Guest.start(
        store,
        image,
        StartOptions(
            "operator",
            NO_PROXY_PORT,
            machine,
            detached=True,
            restore=not cold,
            boot_deadline_s=execution.boot_deadline_s,
        ),
    )
    assert guest.port is not None
    report = BootReport(guest.name, image.name, guest.port, guest.restored, 0.0)
    report.seconds = round(time.monotonic() - started, 2)
    if guest.shell is not None:
        guest.shell.close()
    if guest.qmp is not None:
        guest.qmp.close()
    return report


def _find(store: ImageStore, name: str) -> RunningGuest:
    for guest in store.guests():
        if guest.name == name:
            return guest
    raise InvalidInput(f"no guest named {name!r} (see `aiworker qemu list`)")


def ssh(env: Environment, name: str, command: list[str]) -> int:
    """CMD in guest NAME as root (its exit status), or an interactive shell."""
    store = guest_store(env)
    guest = _find(store, name)
    port = guest.record.get("port")
    if not guest.alive or not isinstance(port, int):
        raise InvalidInput(f"guest {name} is not running")
    image = next((i for i in store.images() if i.name == guest.record.get("image")), None)
    if image is None:
        raise InvalidInput(f"the image of guest {name} is gone")
    if not command:
        return _interactive(port, image.host_key, str(image.client_key))
    shell = GuestShell.connect(port, image.host_key, image.client_key, time.monotonic() + 30)
    try:
        done = shell.run(shlex.join(command), timeout=24 * 3600)
    finally:
        shell.close()
    os.write(1, done.stdout)
    os.write(2, done.stderr)
    return done.exit_code if done.exit_code is not None else 124


def _interactive(port: int, host_key: str, client_key: str) -> int:
    client = which("ssh")
    if client is None:
        raise InvalidInput("an interactive shell needs OpenSSH's ssh; give a command after --")
    known = tempfile.NamedTemporaryFile("w", prefix="aiworker-known-", delete=False)  # noqa: SIM115
    with known:
        known.write(f"[127.0.0.1]:{port} {host_key}\n")
    argv = [
        client,
        "-t",
        "-p",
        str(port),
        "-i",
        client_key,
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={known.name}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "LogLevel=ERROR",
        "root@127.0.0.1",
    ]
    try:
        return run_interactive(argv)
    finally:
        os.unlink(known.name)


def stop(env: Environment, name: str) -> StopReport:
    store = guest_store(env)
    guest = _find(store, name)
    pid = guest.record.get("pid")
    if guest.alive and (guest.path / "qmp.sock").exists():
        with contextlib.suppress(OSError, QmpError, ValueError):
            monitor = Qmp(guest.path / "qmp.sock", time.monotonic() + 5)
            monitor.execute("quit")
            monitor.close()
    end = time.monotonic() + 5
    while isinstance(pid, int) and process_alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    if isinstance(pid, int):
        kill_guest_process(pid, guest.path)
    shutil.rmtree(guest.path, ignore_errors=True)
    return StopReport(name, True)
