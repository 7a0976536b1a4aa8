"""Remote snapshots, the controller's side: the exact tree of a commit published as a
manifest (contracts/snapshot.py) and packs under `$STATE_DIR/snapshots/INDEX/TREE/`, for
runners to fetch over the runner API. A snapshot is named by its root tree id, written
once (a temporary folder renamed into place) and removed when no open job needs it."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from aiworker.contracts.snapshot import (
    NAME_MAX,
    BlobRecord,
    PackRecord,
    SnapshotManifest,
    TreeEntry,
    Uncheckable,
)
from aiworker.runtime.gitobjects import GITLINK_MODE, TREE_MODE, Entry, list_tree, read_blobs

PACK_TARGET = 8 * 1024 * 1024  # packs this big let a runner fetch up to 8 at once
MANIFEST = "manifest.json"


def create_new(path: Path) -> BinaryIO:
    """A new file at PATH, for writing: never an existing one, never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o600), "wb")


def snapshot_dir(state_dir: Path, index: int, snapshot_id: str) -> Path:
    return state_dir / "snapshots" / str(index) / snapshot_id


def pack_path(folder: Path, number: int) -> Path:
    return folder / f"pack-{number}"


def publish(state_dir: Path, repo: Path, index: int, commit: str) -> str:
    """Publish COMMIT's tree from the git repository REPO; returns the snapshot id."""
    root, entries = list_tree(repo, commit)
    target = snapshot_dir(state_dir, index, root)
    if (target / MANIFEST).is_file():
        return root
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        manifest = _build(repo, root, entries, building)
        (building / MANIFEST).write_text(manifest.model_dump_json(), encoding="utf-8")
        try:
            os.rename(building, target)
        except OSError:
            if not (target / MANIFEST).is_file():  # not a concurrent publisher's copy
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return root


def _build(repo: Path, root: str, entries: list[Entry], folder: Path) -> SnapshotManifest:
    trees: dict[str, list[TreeEntry]] = {root: []}
    first_path = {root: ""}  # a tree shared by several paths is listed once
    tree_at = {"": root} | {e.path: e.oid for e in entries if e.mode == TREE_MODE}
    blob_ids: set[str] = set()
    for entry in entries:
        parent, _, name = entry.path.rpartition("/")
        _writable(entry.path, name)
        owner = tree_at[parent]
        if entry.mode == TREE_MODE:
            first_path.setdefault(entry.oid, entry.path)
            trees.setdefault(entry.oid, [])
        if first_path[owner] != parent:
            continue
        trees[owner].append(TreeEntry(name=name, mode=entry.mode, id=entry.oid))
        if entry.mode not in (TREE_MODE, GITLINK_MODE):
            blob_ids.add(entry.oid)
    blobs: dict[str, BlobRecord] = {}
    writer = _PackWriter(folder)
    for oid, size, chunks in read_blobs(repo, sorted(blob_ids)):
        pack, offset = writer.add(size, chunks)
        blobs[oid] = BlobRecord(pack=pack, offset=offset, size=size)
    files = [blobs[e.oid].size for e in entries if e.oid in blobs]  # one per path
    return SnapshotManifest(
        snapshot_id=root,
        trees=trees,
        blobs=blobs,
        packs=writer.close(),
        file_count=len(files),
        total_bytes=sum(files),
    )


def _writable(path: str, name: str) -> None:
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        shown = path.encode(errors="surrogateescape").decode(errors="backslashreplace")
        raise Uncheckable(f"the name '{shown}' is not UTF-8") from None
    if size > NAME_MAX:
        raise Uncheckable(f"the name '{name[:80]}...' is longer than {NAME_MAX} bytes")


class _PackWriter:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.records: list[PackRecord] = []
        self.handle: BinaryIO | None = None
        self.digest = hashlib.sha256()
        self.size = 0

    def add(self, size: int, chunks: Iterable[bytes]) -> tuple[int, int]:
        """Append a blob of SIZE bytes, written as its CHUNKS come; (pack, offset)."""
        if self.handle is None or (self.size and self.size + size > PACK_TARGET):
            self._seal()
            self.handle = open(pack_path(self.folder, len(self.records)), "wb")  # noqa: SIM115
        offset = self.size
        for chunk in chunks:
            self.handle.write(chunk)
            self.digest.update(chunk)
            self.size += len(chunk)
        return len(self.records), offset

    def _seal(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.records.append(PackRecord(size=self.size, sha256=self.digest.hexdigest()))
        self.handle, self.digest, self.size = None, hashlib.sha256(), 0

    def close(self) -> list[PackRecord]:
        self._seal()
        return self.records


def published(state_dir: Path, index: int) -> set[str]:
    """The snapshots published for repository INDEX (not those still being built)."""
    folder = state_dir / "snapshots" / str(index)
    if not folder.is_dir():
        return set()
    return {p.name for p in folder.iterdir() if not p.name.startswith(".")}


def remove_snapshot(state_dir: Path, index: int, snapshot_id: str) -> None:
    shutil.rmtree(snapshot_dir(state_dir, index, snapshot_id), ignore_errors=True)
