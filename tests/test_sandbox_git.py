"""Plain git over the sandbox forge's smart HTTP, authenticated by the same tokens."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from tests.forge_fixtures import git


def test_clone_and_push_with_a_token(forge, tmp_path):
    work = tmp_path / "clone"
    git("clone", "-q", forge.clone_url("alice"), str(work))
    assert (work / "calc.py").read_text().startswith("def add")
    (work / "NOTES.md").write_text("notes\n")
    git("add", "NOTES.md", cwd=work)
    git("commit", "-qm", "notes", cwd=work)
    git("push", "-q", "origin", "HEAD:refs/heads/notes", cwd=work)
    pushed = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    assert forge.client("alice").branch("team", "app", "notes").commit.id == pushed


def test_read_only_token_cannot_push(forge, tmp_path):
    work = tmp_path / "clone"
    git("clone", "-q", forge.clone_url("reader"), str(work))
    (work / "x.txt").write_text("x\n")
    git("add", "x.txt", cwd=work)
    git("commit", "-qm", "x", cwd=work)
    refused = git("push", "origin", "HEAD:refs/heads/sneaky", cwd=work, check=False)
    assert refused.returncode != 0
    assert "403" in refused.stderr
    assert [b.name for b in forge.client("reader").branches("team", "app")] == ["main"]


def test_bad_token_and_anonymous_push_are_refused(forge, tmp_path):
    host = forge.url.split("://", 1)[1]
    anonymous = git("ls-remote", f"http://{host}/team/app.git", check=False)
    assert anonymous.returncode == 0  # public repository: anonymous read works
    work = tmp_path / "clone"
    git("clone", "-q", f"http://{host}/team/app.git", str(work))
    (work / "y").write_text("y")
    git("add", "y", cwd=work)
    git("commit", "-qm", "y", cwd=work)
    anonymous_push = git("push", "origin", "HEAD:refs/heads/y", cwd=work, check=False)
    assert anonymous_push.returncode != 0
    bad_url = f"http://x:not-a-token@{host}/team/app.git"
    bad_push = git("push", bad_url, "HEAD:refs/heads/y", cwd=work, check=False)
    assert bad_push.returncode != 0
    assert "401" in bad_push.stderr or "Authentication failed" in bad_push.stderr
    assert [b.name for b in forge.client("alice").branches("team", "app")] == ["main"]


def test_serve_and_seed_commands(tmp_path):
    data = tmp_path / "forge"
    seeded = subprocess.run(
        [sys.executable, "-m", "aiworker", "--json", "sandbox", "seed", "--data", str(data)],
        capture_output=True,
        text=True,
        check=True,
    )
    document = json.loads(seeded.stdout)
    roles = {u["login"]: u["role"] for u in document["users"]}
    assert roles["admin"] == "site admin"
    assert {"planner-bot", "worker-bot", "reviewer-bot", "alice", "reader"} <= set(roles)
    assert document["repositories"][0]["full_name"] == "team/app"
    again = subprocess.run(
        [sys.executable, "-m", "aiworker", "--json", "sandbox", "seed", "--data", str(data)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(again.stdout) == document  # idempotent
    server = subprocess.Popen(
        [sys.executable, "-m", "aiworker", "sandbox", "serve", "--data", str(data), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stderr.readline()
        url = line.strip().rsplit(" ", 1)[1]
        token = next(u["token"] for u in document["users"] if u["login"] == "worker-bot")
        from aiworker.adapters.forgejo import ForgejoClient

        client = ForgejoClient(url, token)
        assert client.current_user().login == "worker-bot"
        assert [i.number for i in client.list_issues("team", "app", assignee="worker-bot")] == [1]
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=10)
        server.stderr.close()
    assert server.returncode == 0


def test_serve_refuses_a_non_loopback_host(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "aiworker",
            "sandbox",
            "serve",
            "--data",
            str(tmp_path),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ},
    )
    assert result.returncode == 2
    assert "loopback" in result.stderr


def test_ordinary_git_with_many_refs_and_a_large_push(forge, tmp_path):
    """git gzips its fetch negotiation once a repository has a few dozen refs, and sends
    a push over 1 MiB chunked: both are everyday git, both must work."""
    work = tmp_path / "work"
    git("clone", "-q", forge.clone_url("alice"), str(work))
    blob = work / "blob.bin"
    blob.write_bytes(os.urandom(5 * 1024 * 1024))
    git("add", "blob.bin", cwd=work)
    git("commit", "-qm", "five megabytes", cwd=work)
    for number in range(50):
        git("branch", f"topic-{number:02d}", cwd=work)
    pushed = git("push", "-q", "origin", "--all", cwd=work, check=False)
    assert pushed.returncode == 0, pushed.stderr
    head = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    assert forge.client("alice").branch("team", "app", "topic-49").commit.id == head
    # A clone negotiating against 50 refs (gzip-encoded request) and fetching 5 MB.
    mirror = tmp_path / "mirror"
    cloned = git("clone", "-q", forge.clone_url("alice"), str(mirror), check=False)
    assert cloned.returncode == 0, cloned.stderr
    assert (mirror / "blob.bin").read_bytes() == blob.read_bytes()
    fetched = git("fetch", "-q", "origin", cwd=work, check=False)
    assert fetched.returncode == 0, fetched.stderr
    refs = git("ls-remote", "--heads", "origin", cwd=mirror).stdout.splitlines()
    assert len(refs) == 51


def test_serving_an_unseeded_folder_says_so_and_serves_what_a_seed_makes_later(tmp_path):
    """A mistyped --data would serve an empty forge, and every token would look refused:
    the forge says the folder holds nothing yet, and serves the users a seed makes."""
    data = tmp_path / "not-seeded"
    server = subprocess.Popen(
        [sys.executable, "-m", "aiworker", "sandbox", "serve", "--data", str(data), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = server.stderr.readline().strip().rsplit(" ", 1)[1]
        assert server.stderr.readline() == (
            f"note: {data} holds no users or repositories yet; `aiworker sandbox seed --data "
            f"{data}` makes them, and this forge serves them once made\n"
        )
        seeded = subprocess.run(
            [sys.executable, "-m", "aiworker", "--json", "sandbox", "seed", "--data", str(data)],
            capture_output=True,
            text=True,
            check=True,
        )
        token = next(
            u["token"] for u in json.loads(seeded.stdout)["users"] if u["login"] == "worker-bot"
        )
        from aiworker.adapters.forgejo import ForgejoClient

        assert ForgejoClient(url, token).current_user().login == "worker-bot"
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=10)
        server.stderr.close()
