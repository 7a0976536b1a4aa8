"""The git cache against the sandbox forge: fetch, pins, bundles, ancestry, no token leaks."""

from __future__ import annotations

import subprocess

import pytest

from aiworker.runtime.gitcache import AncestryRejected, GitCache
from tests.forge_fixtures import git


@pytest.fixture
def cache(forge, state_dir):
    cache = GitCache(state_dir)
    branches = cache.fetch(1, f"{forge.url}/team/app.git", forge.tokens["worker-bot"])
    return cache, branches


def workspace_from(cache, tmp_path, slot, name="ws"):
    bundle = cache.bundle_out(1, slot, tmp_path / f"{name}.bundle")
    work = tmp_path / name
    git("init", "-q", str(work))
    git("fetch", "-q", str(bundle), f"refs/aiworker/slot-{slot}/base:refs/heads/base", cwd=work)
    git("checkout", "-q", "-b", "work", "base", cwd=work)
    return work


def test_fetch_pins_full_hashes(cache, forge):
    cache, branches = cache
    main = forge.client("worker-bot").branch("team", "app", "main").commit.id
    assert branches == {"main": main}
    assert cache.pin(1, 2, "base", "refs/remotes/origin/main") == main
    assert cache.pinned(1, 2, "base") == main
    assert cache.pinned(1, 3, "base") is None


def test_result_bundle_round_trip(cache, tmp_path):
    cache, _ = cache
    base = cache.pin(1, 1, "base", "refs/remotes/origin/main")
    work = workspace_from(cache, tmp_path, 1)
    (work / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    git("commit", "-qam", "Fix add", cwd=work)
    head = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    result = tmp_path / "result.bundle"
    git("bundle", "create", "-q", str(result), f"{base}..work", cwd=work)
    assert cache.import_result(1, 1, result, "refs/heads/work") == head
    assert cache.pinned(1, 1, "head") == head


def test_unrelated_history_is_rejected(cache, tmp_path):
    cache, _ = cache
    cache.pin(1, 1, "base", "refs/remotes/origin/main")
    other = tmp_path / "other"
    git("init", "-q", "-b", "main", str(other))
    (other / "x").write_text("x")
    git("add", "x", cwd=other)
    git("commit", "-qm", "unrelated", cwd=other)
    bundle = tmp_path / "bad.bundle"
    git("bundle", "create", "-q", str(bundle), "main", cwd=other)
    with pytest.raises(AncestryRejected, match="does not descend from the pinned base"):
        cache.import_result(1, 1, bundle, "refs/heads/main")
    assert cache.pinned(1, 1, "head") is None
    refs = subprocess.run(
        ["git", "--git-dir", str(cache.path(1)), "for-each-ref"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "incoming" not in refs


def test_token_is_never_stored(cache, forge):
    cache, _ = cache
    token = forge.tokens["worker-bot"]
    for path in cache.path(1).rglob("*"):
        if path.is_file() and path.stat().st_size < 1_000_000:
            assert token.encode() not in path.read_bytes(), path
