"""Remote snapshots: the exact tree of a commit, published from real git, written by a
runner with every tree, blob and pack checked, and hostile manifests refused, each with a
named reason, before anything is written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from aiworker.core.runner.materialise import Bounds, SnapshotRejected, materialise
from aiworker.core.runner.snapshots import MANIFEST, pack_path, publish, snapshot_dir
from aiworker.runtime.gitobjects import tree_id
from tests.fleet_fixtures import commit_tree
from tests.forge_fixtures import git


class Folder:
    """A fetcher over a snapshot folder, as the runner API would serve it."""

    def __init__(self, folder):
        self.folder = folder

    def manifest(self, limit):
        data = (self.folder / MANIFEST).read_bytes()
        if len(data) > limit:
            raise SnapshotRejected("snapshot_too_large", "over the bound")
        return data

    def pack(self, number, dest, limit):
        shutil.copyfile(pack_path(self.folder, number), dest)


@pytest.fixture
def published(tmp_path):
    repo = tmp_path / "repo"
    files = {
        "ci/run": "#!/bin/sh\necho ok\n",
        "src/a.txt": "same\n",
        "copy/a.txt": "same\n",
        "big.bin": bytes(range(256)) * 40_000,  # 10 MB: more than one pack's 8 MiB
        "deep/x/y/z/file": "deep\n",
    }
    tree = commit_tree(repo, files, {"src/link": "../big.bin"})
    state = tmp_path / "state"
    assert publish(state, repo, 1, "HEAD") == tree
    return tree, snapshot_dir(state, 1, tree), tmp_path


def test_a_snapshot_is_the_exact_tree_of_the_commit(published):
    tree, folder, tmp = published
    target = tmp / "out"
    target.mkdir()
    counts = materialise(Folder(folder), tree, target, tmp / "scratch")
    assert (counts["files"], counts["symlinks"]) == (5, 1)
    assert (target / "big.bin").read_bytes() == bytes(range(256)) * 40_000
    assert (target / "ci/run").stat().st_mode & 0o111
    assert (target / "src/link").readlink().as_posix() == "../big.bin"
    # packs of at most 8 MiB, unless one blob alone is bigger
    sizes = sorted(p.stat().st_size for p in folder.glob("pack-*"))
    assert len(sizes) >= 2
    assert sizes[-2] <= 8 * 1024 * 1024 < sizes[-1] == 10_240_000
    # git itself agrees: the written tree is the snapshot
    git("init", "-q", str(target))
    git("add", "-A", cwd=target)
    written = subprocess.run(
        ["git", "-C", str(target), "write-tree"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert written == tree


def edit(folder, change):
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def root_entries(manifest):
    return manifest["trees"][manifest["snapshot_id"]]


def rehash_root(manifest, entries):
    """Give the root the id its (edited) entries hash to, as a careful attacker would."""
    old = manifest["snapshot_id"]
    new = tree_id((e["name"], e["mode"], e["id"]) for e in entries)
    manifest["trees"].pop(old)
    manifest["trees"][new] = entries
    manifest["snapshot_id"] = new
    return new


def _cycle(m):
    inner = next(e for e in root_entries(m) if e["name"] == "src")
    m["trees"][inner["id"]].append({"name": "loop", "mode": "40000", "id": m["snapshot_id"]})


def _escape(name):
    def change(m):
        entries = [*root_entries(m), {"name": name, "mode": "100644", "id": "0" * 40}]
        m["blobs"]["0" * 40] = {"pack": 0, "offset": 0, "size": 0}
        rehash_root(m, entries)

    return change


def _gitlink(m):
    entries = [*root_entries(m), {"name": "vendor", "mode": "160000", "id": "1" * 40}]
    rehash_root(m, entries)


HOSTILE = {
    "malformed": (lambda m: m.pop("packs"), Bounds(), "snapshot_malformed"),
    "unknown_field": (lambda m: m.update(extra=1), Bounds(), "snapshot_malformed"),
    "unused_record": (
        lambda m: m["blobs"].update({"f" * 40: {"pack": 0, "offset": 0, "size": 1}}),
        Bounds(),
        "snapshot_unknown_record",
    ),
    "missing_tree": (
        lambda m: m["trees"].pop(next(e["id"] for e in root_entries(m) if e["name"] == "deep")),
        Bounds(),
        "snapshot_unknown_record",
    ),
    "cycle": (_cycle, Bounds(), "snapshot_cycle"),
    "too_deep": (lambda m: None, Bounds(depth=3), "snapshot_too_deep"),
    "dotdot": (_escape(".."), Bounds(), "snapshot_path_escape"),
    "dot_git": (_escape(".GIT"), Bounds(), "snapshot_path_escape"),
    "slash": (_escape("a/../../etc"), Bounds(), "snapshot_path_escape"),
    "too_many_files": (lambda m: None, Bounds(files=3), "snapshot_too_large"),
    "too_many_bytes": (lambda m: None, Bounds(total_bytes=1000), "snapshot_too_large"),
    "pack_over_bound": (lambda m: None, Bounds(pack_bytes=1000), "snapshot_too_large"),
    "manifest_over_bound": (lambda m: None, Bounds(manifest_bytes=100), "snapshot_too_large"),
    "blob_outside_pack": (
        lambda m: next(iter(m["blobs"].values())).update(offset=10**12),
        Bounds(),
        "snapshot_malformed",
    ),
    "declared_size_lies": (lambda m: m.update(total_bytes=1), Bounds(), "snapshot_malformed"),
    "tree_hash_lies": (
        lambda m: root_entries(m)[0].update(mode="100755"),
        Bounds(),
        "snapshot_checksum_mismatch",
    ),
    "unlocked_external": (_gitlink, Bounds(), "snapshot_external_unlocked"),
    "unused_pack": (
        lambda m: m["packs"].append({"size": 1, "sha256": "0" * 64}),
        Bounds(),
        "snapshot_unknown_record",
    ),
    "packs_over_the_total": (lambda m: None, Bounds(total_bytes=10_000_000), "snapshot_too_large"),
    "directories_count_too": (lambda m: None, Bounds(files=9), "snapshot_too_large"),
    "long_path": (lambda m: None, Bounds(path_bytes=10), "snapshot_too_large"),
    "all_paths_too_long": (lambda m: None, Bounds(all_path_bytes=40), "snapshot_too_large"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_manifest_is_refused_before_anything_is_written(published, case):
    tree, folder, tmp = published
    change, bounds, code = HOSTILE[case]
    edit(folder, change)
    asked = json.loads((folder / MANIFEST).read_text()).get("snapshot_id", tree)
    target = tmp / "out"
    target.mkdir()
    with pytest.raises(SnapshotRejected) as refused:
        materialise(Folder(folder), asked, target, tmp / "scratch", bounds)
    assert refused.value.code == code, refused.value.message
    assert list(target.iterdir()) == []


def test_a_snapshot_other_than_the_one_asked_for_is_refused(published):
    _tree, folder, tmp = published
    with pytest.raises(SnapshotRejected) as refused:
        materialise(Folder(folder), "a" * 40, tmp / "out", tmp / "scratch")
    assert refused.value.code == "snapshot_mismatch"


@pytest.mark.parametrize("damage", ["pack_bytes", "pack_and_its_digest"])
def test_damaged_packs_are_refused(published, damage):
    tree, folder, tmp = published
    pack = pack_path(folder, 0)
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pack.write_bytes(bytes(data))
    if damage == "pack_and_its_digest":  # then the blob's own git id catches it
        import hashlib

        edit(folder, lambda m: m["packs"][0].update(sha256=hashlib.sha256(data).hexdigest()))
    target = tmp / "out"
    target.mkdir()
    with pytest.raises(SnapshotRejected) as refused:
        materialise(Folder(folder), tree, target, tmp / "scratch")
    assert refused.value.code == "snapshot_checksum_mismatch"


def test_a_locked_external_tree_is_written_from_its_own_snapshot(tmp_path):
    """A gitlink (a submodule) the request locks to a snapshot of another repository."""
    state = tmp_path / "state"
    library = tmp_path / "library"
    library_tree = commit_tree(library, {"lib.py": "x = 1\n"})
    library_head = git("rev-parse", "HEAD", cwd=library).stdout.strip()
    app = tmp_path / "app"
    commit_tree(app, {"ci/run": "#!/bin/sh\n"})
    git("update-index", "--add", "--cacheinfo", f"160000,{library_head},vendor/lib", cwd=app)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "sub", cwd=app)
    app_tree = publish(state, app, 1, "HEAD")
    assert publish(state, library, 2, "HEAD") == library_tree
    target = tmp_path / "out"
    target.mkdir()
    scratch = tmp_path / "scratch"

    def external(folder):
        return materialise(
            Folder(snapshot_dir(state, 2, library_tree)), library_tree, folder, scratch / "x"
        )

    outer = Folder(snapshot_dir(state, 1, app_tree))
    counts = materialise(
        outer, app_tree, target, scratch / "main", externals={"vendor/lib": external}
    )
    assert (target / "vendor/lib/lib.py").read_text() == "x = 1\n"
    assert counts["files"] == 2
    assert sorted(p.name for p in target.iterdir()) == ["ci", "vendor"]


def test_a_large_file_is_published_without_being_held_in_memory(tmp_path):
    """The controller publishes an agent's head for its checks: a file of 256 MiB in it
    streams into the packs (peak memory was the size of the largest file)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    with open(repo / "big.bin", "wb") as handle:
        handle.truncate(256 << 20)
    git("add", "big.bin", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "big", cwd=repo)
    state = tmp_path / "state"
    peak = subprocess.run(
        [
            sys.executable,
            "-c",
            # VmHWM, not ru_maxrss: that one keeps the forking process's size across exec
            # (a pytest worker's, hundreds of MiB late in a run).
            "import sys; from pathlib import Path;"
            "from aiworker.core.runner.snapshots import publish;"
            "publish(Path(sys.argv[1]), Path(sys.argv[2]), 1, 'HEAD');"
            "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))",
            str(state),
            str(repo),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(peak.stdout) < 128 << 10, f"peak {int(peak.stdout) >> 10} MiB"  # KiB
    [folder] = (state / "snapshots" / "1").iterdir()
    packs = sorted(folder.glob("pack-*"))
    assert sum(p.stat().st_size for p in packs) == 256 << 20
