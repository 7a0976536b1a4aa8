"""The guest image store under GUESTS_DIR (default $STATE_DIR/guests):

    images/NAME/      base.qcow2, vmlinuz, initrd.img, manifest.json, host_key.pub,
                      client_key (0600), warm.qcow2 + state.bin (the saved guest state)
    current           a symlink to images/NAME, replaced atomically by provisioning
    run/GUEST/        one running guest: overlay.qcow2, qmp.sock, console.log, guest.json

An image is never rewritten: provisioning makes a new NAME and switches `current`; an
old image is removed only once no running guest's overlay is backed by it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiworker.runtime.processes import process_alive


@dataclass(frozen=True)
class Image:
    path: Path
    # A cache layer (layers/NAME/ of this image): its own warm disk, backed by the base,
    # holding what its script added (caches, a browser), and its own saved state.
    layer: str | None = None

    @property
    def name(self) -> str:
        return self.path.name

    def with_layer(self, layer: str | None) -> Image:
        return Image(self.path, layer)

    @property
    def layer_dir(self) -> Path:
        return self.path / "layers" / str(self.layer)

    @property
    def base(self) -> Path:
        return self.path / "base.qcow2"

    @property
    def kernel(self) -> Path:
        return self.path / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.path / "initrd.img"

    @property
    def warm(self) -> Path:
        return (self.layer_dir if self.layer else self.path) / "warm.qcow2"

    @property
    def state(self) -> Path:
        return (self.layer_dir if self.layer else self.path) / "state.bin"

    @property
    def cold_disk(self) -> Path:
        """What a cold boot's overlay is backed by: the base, or the layer's disk."""
        return self.warm if self.layer else self.base

    def layers(self) -> list[str]:
        folder = self.path / "layers"
        return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []

    @property
    def client_key(self) -> Path:
        return self.path / "client_key"

    @property
    def host_key(self) -> str:
        return (self.path / "host_key.pub").read_text().strip()

    def manifest(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads((self.path / "manifest.json").read_text())
        return document

    def saved_machine(self) -> Any:
        """The machine the saved state belongs to (a layer has its own)."""
        if self.layer:
            try:
                return json.loads((self.layer_dir / "layer.json").read_text()).get("machine")
            except (OSError, ValueError):
                return None
        return self.manifest().get("machine")

    @property
    def restorable(self) -> bool:
        return self.warm.is_file() and self.state.is_file()

    def age_s(self) -> float:
        return time.time() - (self.path / "manifest.json").stat().st_mtime


@dataclass(frozen=True)
class RunningGuest:
    name: str
    path: Path
    record: dict[str, Any]

    @property
    def alive(self) -> bool:
        pid = self.record.get("pid")
        return isinstance(pid, int) and process_alive(pid)

    @property
    def owner_alive(self) -> bool:
        owner = self.record.get("owner_pid")
        return owner is None or (isinstance(owner, int) and process_alive(owner))


class ImageStore:
    def __init__(self, root: Path) -> None:
        self.root = root.absolute()  # QEMU runs in the guest's folder: no relative paths
        self.images_dir = self.root / "images"
        self.run_dir = self.root / "run"
        self.current_link = self.root / "current"

    def ensure(self) -> None:
        for folder in (self.root, self.images_dir, self.run_dir):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)

    def current(self) -> Image | None:
        try:
            target = self.current_link.resolve(strict=True)
        except (FileNotFoundError, RuntimeError):
            return None
        image = Image(target)
        return image if (image.path / "manifest.json").is_file() else None

    def images(self) -> list[Image]:
        if not self.images_dir.is_dir():
            return []
        return [Image(p) for p in sorted(self.images_dir.iterdir()) if p.is_dir()]

    def new_image_dir(self) -> Path:
        self.ensure()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = self.images_dir / f"img-{stamp}-{secrets.token_hex(3)}"
        path.mkdir(mode=0o700)
        return path

    def publish(self, image: Image) -> None:
        """Point `current` at IMAGE in one rename."""
        temporary = self.root / f".current-{secrets.token_hex(4)}"
        os.symlink(Path("images") / image.name, temporary)
        os.replace(temporary, self.current_link)

    def guests(self) -> list[RunningGuest]:
        if not self.run_dir.is_dir():
            return []
        found = []
        for path in sorted(self.run_dir.iterdir()):
            try:
                record = json.loads((path / "guest.json").read_text())
            except (OSError, ValueError):
                record = {}
            found.append(RunningGuest(path.name, path, record))
        return found

    def referenced(self) -> set[str]:
        """Images a guest directory (running or not yet swept) still uses."""
        return {str(g.record.get("image")) for g in self.guests()} | {
            image.name for image in [self.current()] if image is not None
        }

    def prune(self, keep_building: float = 3600) -> list[str]:
        """Remove images nothing uses (not current, no guest directory naming them); one
        without a manifest is being built, unless older than KEEP_BUILDING seconds."""
        used = self.referenced()
        removed = []
        for image in self.images():
            if image.name in used:
                continue
            building = not (image.path / "manifest.json").is_file()
            if building and time.time() - image.path.stat().st_mtime < keep_building:
                continue
            shutil.rmtree(image.path, ignore_errors=True)
            removed.append(image.name)
        return removed
