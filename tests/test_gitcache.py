"""The git cache against the sandbox forge: fetch, pins, bundles, ancestry, no token leaks."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from aiworker.runtime.git_failures import GitCacheError, failure, got_through
from aiworker.runtime.gitcache import AncestryRejected, GitCache
from tests.fake_forge import USER
from tests.forge_fixtures import git
from tests.test_forgejo_faults import CANARY, client


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


def test_the_clone_url_is_the_configured_forges_whatever_the_forge_names(fake, tmp_path):
    """git sends the token with every request to the clone URL: a forge's answer naming
    another host, or an option for git, never becomes it."""
    planted = tmp_path / "planted"
    for named in (f"--upload-pack=touch {planted};", "http://elsewhere.example/team/app.git"):
        repo = {
            "id": 1,
            "name": "app",
            "full_name": "team/app",
            "owner": USER,
            "default_branch": "main",
            "clone_url": named,
        }
        _, url = fake(("json", 200, repo, {}))
        assert client(url).repository("team", "app").clone_url == f"{url}/team/app.git"


def test_the_cache_refuses_a_remote_git_would_read_as_an_option(state_dir, tmp_path):
    planted = tmp_path / "planted"
    cache = GitCache(state_dir)
    for remote, token in ((f"--upload-pack=touch {planted};", None), ("/srv/team/app", CANARY)):
        with pytest.raises(GitCacheError, match="not an http"):
            cache.fetch(1, remote, token)
        with pytest.raises(GitCacheError, match="not an http"):
            cache.push(1, "0" * 40, remote, CANARY, "aiworker/task-1")
    assert not planted.exists()


def test_git_follows_no_redirect_with_the_token(fake, state_dir):
    """A forge that redirects git elsewhere: git would send the token on to the new
    address for the rest of the fetch."""
    elsewhere, other = fake()
    redirect = ("json", 302, {}, {"Location": f"{other}/team/app.git/info/refs"})
    script, url = fake(redirect, redirect)
    with pytest.raises(GitCacheError):
        GitCache(state_dir).fetch(1, f"{url}/team/app.git", CANARY)
    assert script.seen  # git asked the forge
    assert elsewhere.seen == []  # and went nowhere else


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        (
            "error: RPC failed; HTTP 502 curl 22 The requested URL returned error: 502\n"
            "fatal: expected flush after ref listing\n",
            "git_unavailable",
        ),
        (
            "fatal: unable to access 'http://forge/team/app.git/': Failed to connect to forge "
            "port 3000 after 0 ms: Couldn't connect to server\n",
            "git_unavailable",
        ),
        (
            "error: RPC failed; curl 18 transfer closed with outstanding read data remaining\n"
            "fetch-pack: unexpected disconnect while reading sideband packet\n"
            "fatal: early EOF\n",
            "git_unavailable",
        ),
        (  # a push too big for the proxy: its connection breaks off too, and no retry helps
            "error: RPC failed; HTTP 413 curl 22 The requested URL returned error: 413\n"
            "send-pack: unexpected disconnect while reading sideband packet\n"
            "fatal: the remote end hung up unexpectedly\n",
            "git_cache",
        ),
        ("fatal: couldn't find remote ref refs/heads/gone\n", "git_cache"),
    ],
)
def test_what_git_says_names_an_outage_apart_from_a_failure(tmp_path, stderr, kind):
    """Git's own words (as git 2.39 over curl prints them): an outage on the way to the
    forge is unavailable (exit 75, tried again, charged nothing), anything else not."""
    error = failure(tmp_path / "repo-1.git", "fetch", stderr)
    assert error.code == kind
    assert error.exit_code == (75 if kind == "git_unavailable" else 1)


def test_an_outage_under_git_is_waited_out_for_an_hour_then_charged(tmp_path):
    """An outage git meets is tried again without charge; one lasting over an hour (a
    proxy that always cuts a large fetch off) is charged, so the task ends by its budget
    instead of being tried for ever; getting through ends it."""
    cache = tmp_path / "repo-1.git"
    said = "error: RPC failed; HTTP 504 curl 22 The requested URL returned error: 504\n"
    assert failure(cache, "fetch", said).code == "git_unavailable"
    mark = tmp_path / "repo-1.git.outage"
    assert mark.exists()
    assert failure(cache, "fetch", said).code == "git_unavailable"
    long_ago = time.time() - 3700
    os.utime(mark, (long_ago, long_ago))
    charged = failure(cache, "fetch", said)
    assert (charged.code, charged.exit_code) == ("git_cache", 1)
    assert charged.message == (
        "git fetch has not got through to the forge for 62 minutes (RPC failed; HTTP 504): "
        "no longer waited out without charge"
    )
    got_through(cache)
    assert not mark.exists()
    assert failure(cache, "fetch", said).code == "git_unavailable"
