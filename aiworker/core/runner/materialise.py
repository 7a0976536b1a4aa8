"""Remote snapshots, the runner's side: fetch a manifest and its packs, check the whole
plan before anything is written, write the tree (each blob checked as it is), and hash
what was written. Every refusal has a named code (README: "The runner fleet"); entry
points that are symbolic links are refused later, by requests.resolve_entrypoint."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from aiworker.contracts.native_job import Materialization
from aiworker.contracts.snapshot import SnapshotManifest
from aiworker.core.runner.requests import RequestRejected
from aiworker.runtime.gitobjects import (
    GITLINK_MODE,
    LINK_MODE,
    TREE_MODE,
    blob_id,
    directory_tree_id,
)
from aiworker.runtime.gitobjects import tree_id as git_tree_id

GIB = 1024**3


class SnapshotRejected(RequestRejected):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message, "source.snapshot_id")


@dataclass(frozen=True)
class Bounds:
    manifest_bytes: int = 64 * 1024 * 1024
    files: int = 10_000_000
    total_bytes: int = 512 * GIB
    pack_bytes: int = 16 * GIB
    depth: int = 256
    path_bytes: int = 4096  # one path
    all_path_bytes: int = 1024**3  # every path together: what the plan holds in memory
    transfers: int = 8


class Fetcher(Protocol):
    def manifest(self, limit: int) -> bytes:
        """The manifest's bytes; SnapshotRejected when it is longer than LIMIT."""

    def pack(self, number: int, dest: Path, limit: int) -> None:
        """Write pack NUMBER to DEST; SnapshotRejected when it is longer than LIMIT."""


@dataclass
class _Plan:
    directories: list[str] = field(default_factory=list)
    files: list[tuple[str, str, str]] = field(default_factory=list)  # path, mode, blob
    gitlinks: dict[str, str] = field(default_factory=dict)  # path -> commit
    total: int = 0
    path_bytes: int = 0


def materialise(
    fetcher: Fetcher,
    snapshot_id: str,
    target: Path,
    scratch: Path,
    bounds: Bounds = Bounds(),
    externals: Mapping[str, Callable[[Path], Materialization]] | None = None,
) -> Materialization:
    """Write snapshot SNAPSHOT_ID into the empty directory TARGET (packs go to SCRATCH);
    EXTERNALS materialise each locked external tree the request names, by path."""
    started = time.monotonic()
    manifest = _parse(fetcher.manifest(bounds.manifest_bytes), snapshot_id, bounds)
    plan = _plan(manifest, bounds)
    unnamed = sorted(set(plan.gitlinks) - set(externals or {}))
    if unnamed:
        raise SnapshotRejected(
            "snapshot_external_unlocked",
            f"the tree holds external trees the request does not lock: {', '.join(unnamed)}",
        )
    scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
    _download(fetcher, manifest, scratch, bounds)
    counts = _write(manifest, plan, target, scratch)
    for path in sorted(plan.gitlinks):  # each one locked: checked above
        counts = _sum(counts, (externals or {})[path](target / path))
    written = directory_tree_id(target, plan.gitlinks)
    if written != snapshot_id:
        raise SnapshotRejected(
            "snapshot_tree_mismatch", f"the written tree is {written}, not {snapshot_id}"
        )
    return {**counts, "duration_ms": int((time.monotonic() - started) * 1000)}


def _parse(raw: bytes, snapshot_id: str, bounds: Bounds) -> SnapshotManifest:
    if len(raw) > bounds.manifest_bytes:
        raise SnapshotRejected(
            "snapshot_too_large", f"the manifest is over {bounds.manifest_bytes} bytes"
        )
    try:
        manifest = SnapshotManifest.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise SnapshotRejected("snapshot_malformed", f"manifest {where}: {first['msg']}") from None
    if manifest.snapshot_id != snapshot_id:
        raise SnapshotRejected(
            "snapshot_mismatch", f"the manifest is of {manifest.snapshot_id}, not {snapshot_id}"
        )
    if len(manifest.blobs) > bounds.files or len(manifest.trees) > bounds.files:
        raise SnapshotRejected("snapshot_too_large", f"more records than {bounds.files} files")
    for number, pack in enumerate(manifest.packs):
        if pack.size > bounds.pack_bytes:
            raise SnapshotRejected(
                "snapshot_too_large", f"pack {number} is over {bounds.pack_bytes} bytes"
            )
    if sum(p.size for p in manifest.packs) > bounds.total_bytes:
        raise SnapshotRejected("snapshot_too_large", f"packs over {bounds.total_bytes} bytes")
    if {b.pack for b in manifest.blobs.values()} != set(range(len(manifest.packs))):
        raise SnapshotRejected("snapshot_unknown_record", "a pack holds no listed blob")
    for oid, blob in manifest.blobs.items():
        if (
            blob.pack >= len(manifest.packs)
            or blob.offset + blob.size > manifest.packs[blob.pack].size
        ):
            raise SnapshotRejected("snapshot_malformed", f"blob {oid} lies outside its pack")
    return manifest


def _check_names(names: list[str], oid: str, where: str) -> None:
    if len(set(names)) != len(names):
        raise SnapshotRejected("snapshot_malformed", f"tree {oid} repeats a name")
    for name in names:
        if "/" in name or "\0" in name or name in (".", "..") or name.casefold() == ".git":
            raise SnapshotRejected("snapshot_path_escape", f"{where}{name!r} is not a plain name")


def _plan(manifest: SnapshotManifest, bounds: Bounds) -> _Plan:
    """Walk the trees from the root, checking each; nothing is written yet."""
    plan = _Plan()
    seen_trees: set[str] = set()
    seen_blobs: set[str] = set()
    stack: list[tuple[str, str, tuple[str, ...]]] = [
        (manifest.snapshot_id, "", (manifest.snapshot_id,))
    ]
    while stack:
        oid, prefix, ancestors = stack.pop()
        if len(ancestors) > bounds.depth:
            raise SnapshotRejected("snapshot_too_deep", f"{prefix} is deeper than {bounds.depth}")
        entries = manifest.trees.get(oid)
        if entries is None:
            raise SnapshotRejected("snapshot_unknown_record", f"tree {oid} is not in the manifest")
        _check_names([e.name for e in entries], oid, prefix)
        for entry in entries:
            path = prefix + entry.name
            _count(plan, bounds, path)
            if entry.mode == TREE_MODE:
                if entry.id in ancestors:
                    raise SnapshotRejected("snapshot_cycle", f"tree {path} contains itself")
                plan.directories.append(path)
                stack.append((entry.id, path + "/", (*ancestors, entry.id)))
            elif entry.mode == GITLINK_MODE:
                plan.directories.append(path)
                plan.gitlinks[path] = entry.id
            else:
                _add_file(manifest, plan, bounds, path, entry.mode, entry.id)
                seen_blobs.add(entry.id)
        if oid not in seen_trees and git_tree_id((e.name, e.mode, e.id) for e in entries) != oid:
            raise SnapshotRejected("snapshot_checksum_mismatch", f"tree {oid} has other entries")
        seen_trees.add(oid)
    unused = (set(manifest.trees) - seen_trees) | (set(manifest.blobs) - seen_blobs)
    if unused:
        raise SnapshotRejected(
            "snapshot_unknown_record",
            f"{len(unused)} records are not in the tree, e.g. {min(unused)}",
        )
    if (manifest.file_count, manifest.total_bytes) != (len(plan.files), plan.total):
        raise SnapshotRejected(
            "snapshot_malformed", "the declared file count or size is not what the trees hold"
        )
    return plan


def _count(plan: _Plan, bounds: Bounds, path: str) -> None:
    """One more path: within the bounds on their number and on their bytes (one and all:
    what the plan holds in memory)."""
    plan.path_bytes += len(path)
    if len(path) > bounds.path_bytes or plan.path_bytes > bounds.all_path_bytes:
        raise SnapshotRejected(
            "snapshot_too_large",
            f"a path over {bounds.path_bytes} bytes or paths over {bounds.all_path_bytes}",
        )
    if len(plan.directories) + len(plan.files) >= bounds.files:
        raise SnapshotRejected(
            "snapshot_too_large", f"more than {bounds.files} files and directories"
        )


def _add_file(
    manifest: SnapshotManifest, plan: _Plan, bounds: Bounds, path: str, mode: str, oid: str
) -> None:
    blob = manifest.blobs.get(oid)
    if blob is None:
        raise SnapshotRejected("snapshot_unknown_record", f"blob {oid} of {path} is not listed")
    plan.files.append((path, mode, oid))
    plan.total += blob.size
    if len(plan.files) > bounds.files or plan.total > bounds.total_bytes:
        raise SnapshotRejected(
            "snapshot_too_large", f"more than {bounds.files} files or {bounds.total_bytes} bytes"
        )


def _download(fetcher: Fetcher, manifest: SnapshotManifest, scratch: Path, bounds: Bounds) -> None:
    def one(number: int) -> None:
        pack = manifest.packs[number]
        dest = scratch / f"pack-{number}"
        fetcher.pack(number, dest, pack.size)
        digest = hashlib.sha256()
        with open(dest, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        if dest.stat().st_size != pack.size or digest.hexdigest() != pack.sha256:
            raise SnapshotRejected(
                "snapshot_checksum_mismatch", f"pack {number} is not the declared bytes"
            )

    workers = max(1, min(bounds.transfers, len(manifest.packs)))  # a pool of none is refused
    with ThreadPoolExecutor(workers) as pool:
        try:
            list(pool.map(one, range(len(manifest.packs))))
        except BaseException:
            pool.shutdown(cancel_futures=True)  # one failed: the packs not begun are no use
            raise


def _write(manifest: SnapshotManifest, plan: _Plan, target: Path, scratch: Path) -> Materialization:
    for path in sorted(plan.directories):
        os.mkdir(target / path, 0o755)
    handles: dict[int, int] = {}
    symlinks = 0
    try:
        for path, mode, oid in plan.files:
            blob = manifest.blobs[oid]
            if blob.pack not in handles:
                handles[blob.pack] = os.open(scratch / f"pack-{blob.pack}", os.O_RDONLY)
            fd = handles[blob.pack]
            if mode == LINK_MODE:
                text = os.pread(fd, min(blob.size, 4096), blob.offset)
                if len(text) != blob.size or blob_id(text) != oid:
                    raise SnapshotRejected("snapshot_checksum_mismatch", f"{path} is not {oid}")
                if b"\0" in text:
                    raise SnapshotRejected("snapshot_path_escape", f"link {path} holds a NUL")
                os.symlink(text, target / path)
                symlinks += 1
                continue
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            out = os.open(target / path, flags, 0o755 if mode == "100755" else 0o644)
            try:
                _copy_blob(fd, out, blob.offset, blob.size, oid, path)
            finally:
                os.close(out)
    finally:
        for fd in handles.values():
            os.close(fd)
    return Materialization(
        files=len(plan.files) - symlinks,
        directories=len(plan.directories),
        symlinks=symlinks,
        skipped_special=0,
        bytes=plan.total,
        duration_ms=0,
    )


def _copy_blob(src: int, dst: int, offset: int, size: int, oid: str, path: str) -> None:
    digest = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
    done = 0
    while done < size:
        chunk = os.pread(src, min(size - done, 1 << 20), offset + done)
        if not chunk:
            break
        digest.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]
        done += len(chunk)
    if done != size or digest.hexdigest() != oid:
        raise SnapshotRejected("snapshot_checksum_mismatch", f"{path} is not blob {oid}")


def _sum(a: Materialization, b: Materialization) -> Materialization:
    total = a.copy()
    for key in ("files", "directories", "symlinks", "skipped_special", "bytes"):
        total[key] += b[key]
    return total
