"""State the operator must fix (or wait for) is named with its path and what to do, and
nothing is written: a state directory on a read-only file system, a read-only database,
a database locked past the busy timeout. Read-only mounts are real ones, made in a mount
namespace of the command's own (`unshare --mount`), so nothing outside it changes."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from aiworker.store import engine

needs_mounts = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)


def read_only(path: Path, *args: str) -> subprocess.CompletedProcess:
    """`aiworker ARGS` with PATH mounted read-only, in a mount namespace of its own."""
    argv = [sys.executable, "-m", "aiworker", "--json", *args]
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", str(path), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


@needs_mounts
def test_a_state_directory_on_a_read_only_file_system_is_named(upgraded, state_dir):
    before = snapshot(state_dir)
    done = read_only(state_dir, "--state-dir", str(state_dir), "scheduler", "tick")
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "state_unusable"
    assert str(state_dir) in error["message"]
    assert "read-only" in error["message"].lower()
    assert snapshot(state_dir) == before


@needs_mounts
def test_a_database_on_a_read_only_file_system_can_still_be_backed_up(
    upgraded, state_dir, tmp_path
):
    """The kernel remounted the disk read-only (as it does on errors) while a process
    still had commits in the write-ahead log: `db backup` copies the database as it
    stands, those commits included, to another file system, and writes nothing there."""
    writer = sqlite3.connect(upgraded, isolation_level=None)
    try:
        writer.execute("PRAGMA wal_autocheckpoint = 0")  # the commits stay in the log
        for n in range(50):
            writer.execute(
                "INSERT INTO events (kind, data, created_at) VALUES (?, ?, CURRENT_TIMESTAMP)",
                ("test.wal", json.dumps({"n": n})),
            )
        assert Path(f"{upgraded}-wal").stat().st_size > 0
        before = snapshot(state_dir)
        target, payloads = tmp_path / "out" / "backup.db", tmp_path / "out" / "payloads"
        target.parent.mkdir()
        argv = ("--state-dir", str(state_dir), "db", "backup", "--to", str(target))
        done = read_only(state_dir, *argv, "--with-artifacts", str(payloads))
        assert done.returncode == 0, done.stdout + done.stderr
        assert snapshot(state_dir) == before
    finally:
        writer.close()
    report = json.loads(done.stdout)
    assert (report["target"], report["bytes"]) == (str(target), target.stat().st_size)
    assert report["revision"] == engine_revision(upgraded)
    assert report["artifacts"]["payloads"] == 0
    assert json.loads((payloads / "manifest.json").read_text())["snapshot"] == str(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["backup.db", "payloads"]
    copy = sqlite3.connect(f"file:{target}?mode=ro", uri=True)
    try:
        assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert copy.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        found = copy.execute("SELECT count(*) FROM events WHERE kind = 'test.wal'").fetchone()
        assert found == (50,)
    finally:
        copy.close()
    # Everything else still says what to do, naming the backup.
    refused = read_only(state_dir, "--state-dir", str(state_dir), "status")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (
        "`aiworker db backup --to PATH` still copies"
        in json.loads(refused.stdout)["error"]["message"]
    )


def engine_revision(database: Path) -> str:
    with sqlite3.connect(database) as connection:
        return str(connection.execute("SELECT version_num FROM alembic_version").fetchone()[0])


@needs_mounts
def test_a_read_only_database_is_named_and_nothing_is_written(upgraded, state_dir):
    before = snapshot(state_dir)
    done = read_only(upgraded, "--state-dir", str(state_dir), "claim", "--slot", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "state_unusable"
    assert error["message"].startswith(f"{upgraded} is read-only")
    assert snapshot(state_dir)["aiworker.db"] == before["aiworker.db"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: only root writes where it does not own")
@pytest.mark.parametrize(
    "command",
    [
        ("scheduler", "tick"),
        ("status",),
        ("poll",),
        ("web", "serve", "--listen", "127.0.0.1:0"),
        ("scheduler", "install", "--dir", "{units}"),
    ],
)
def test_a_state_directory_of_another_user_is_refused_and_nothing_is_written(
    upgraded, state_dir, command, tmp_path
):
    """Root runs a command on the service user's state directory (as `nobody` here): what
    it made there (0600 files, 0700 directories, locks) would shut the service out, so it
    is refused, naming both users and how to run it instead."""
    for path in (state_dir, *state_dir.rglob("*")):
        os.chown(path, 65534, 65534)
    before = snapshot(state_dir)
    command = [part.format(units=tmp_path / "units") for part in command]
    argv = [sys.executable, "-m", "aiworker", "--json", "--state-dir", str(state_dir), *command]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "state_unusable"
    assert error["message"] == (
        f"state directory {state_dir} belongs to nobody (uid 65534), and this runs as root "
        "(uid 0): what it made there would shut its owner out; nothing was written: run it "
        "as its owner (sudo -u nobody aiworker ...)"
    )
    assert snapshot(state_dir) == before
    assert [p for p in state_dir.rglob("*") if p.stat().st_uid != 65534] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="provisioning runs as root")
def test_root_provisioning_for_the_service_s_state_directory_hands_what_it_made_back(
    upgraded, state_dir, tmp_path
):
    """Provisioning needs root, and the service user owns the state directory (`nobody`
    here): the locks and guests it made there, even for a build that failed, are the
    owner's afterwards, so the service's ticks, `qemu list` and doctor can use them."""
    for path in (state_dir, *state_dir.rglob("*")):
        os.chown(path, 65534, 65534)
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    (recipe / "build.sh").write_text("#!/bin/sh\necho no network for the mirror >&2\nexit 1\n")
    argv = [sys.executable, "-m", "aiworker", "--json", "--state-dir", str(state_dir)]
    done = subprocess.run(
        [*argv, "qemu", "provision", "--recipe", str(recipe)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "build" in json.loads(done.stdout)["error"]["message"]
    made = {p.relative_to(state_dir).parts[0] for p in state_dir.rglob("*")}
    assert {"locks", "guests"} <= made
    assert [
        p for p in state_dir.rglob("*") if (p.lstat().st_uid, p.lstat().st_gid) != (65534,) * 2
    ] == []
    # The service user puts a link where its locks were, to a folder root owns: root's
    # next provisioning hands nothing through it.
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "secret").write_text("root's\n")
    shutil.rmtree(state_dir / "locks")
    (state_dir / "locks").symlink_to(victim)
    os.lchown(state_dir / "locks", 65534, 65534)
    subprocess.run(
        [*argv, "qemu", "provision", "--recipe", str(recipe)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert {p.stat().st_uid for p in (victim, *victim.iterdir())} == {0}


def test_a_database_missing_from_a_used_state_directory_points_to_a_restore(
    cli, upgraded, state_dir
):
    """The database file is gone from a state directory an installation used: starting an
    empty one (what `db upgrade` does) would know none of the tasks and pull requests, and
    publish their issues again; the error says to restore, and what `db upgrade` would do."""
    assert cli("--json", "status").exit_code == 0  # the installation's key is made
    for path in state_dir.glob("aiworker.db*"):
        path.unlink()
    before = snapshot(state_dir)
    refused = cli("--json", "scheduler", "tick")
    assert refused.exit_code == 2, refused
    assert refused.json()["error"]["message"] == (
        f"database {upgraded} is missing, yet state directory {state_dir} was used "
        "(it holds controller-instance): the tasks, and the pull requests they opened, are "
        "known to that database alone. Restore it (`aiworker restore --from BACKUP` into an "
        "empty state directory); `aiworker db upgrade` would start an empty one, which "
        "knows none of them"
    )
    assert snapshot(state_dir) == before
    assert cli("db", "upgrade").exit_code == 0  # the operator's choice, still open


def test_a_database_locked_past_the_busy_timeout_says_so_and_exits_75(cli, upgraded, monkeypatch):
    monkeypatch.setattr(engine, "BUSY_TIMEOUT_MS", 200)
    holder = sqlite3.connect(upgraded, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        result = cli("--json", "claim", "--slot", "1")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert result.exit_code == 75, result
    error = result.json()["error"]
    assert error["code"] == "lock_held"
    assert error["message"].startswith(f"{upgraded} stayed locked by another process")


def test_a_table_damaged_after_the_schema_check_is_named_with_the_fix(cli, upgraded):
    """The schema reads fine but the tasks table's page is garbage: a command that reads
    it says the database is damaged and how to restore it, not the driver's error."""
    connection = sqlite3.connect(upgraded)
    page = connection.execute("SELECT rootpage FROM sqlite_master WHERE name = 'tasks'").fetchone()
    size = connection.execute("PRAGMA page_size").fetchone()
    connection.close()
    with upgraded.open("r+b") as handle:
        handle.seek((page[0] - 1) * size[0])
        handle.write(b"\xff" * size[0])
    for args in (("task", "list"), ("scheduler", "tick")):
        result = cli("--json", *args)
        assert result.exit_code == 2, (args, result)
        assert result.json()["error"]["message"] == (
            f"{upgraded} is damaged; restore it from a backup (`aiworker db backup` made one)"
        )


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("task", "list"),
        ("task", "show", "1"),
        ("providers", "status"),
        ("scheduler", "status"),
        ("scheduler", "tick"),
        ("retention",),
    ],
)
def test_a_command_on_an_uninitialised_store_leaves_nothing_behind(cli, state_dir, args):
    """It says to run `db upgrade` and makes no empty database and no instance key:
    `restore` refuses a state directory that holds them."""
    result = cli("--json", *args)
    assert result.exit_code == 2, result
    assert "is not initialised; run `aiworker db upgrade` first" in result.stdout
    assert not state_dir.exists() or list(state_dir.iterdir()) == []
    assert cli("db", "current").exit_code == 0
    assert not state_dir.exists() or list(state_dir.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ("scheduler", "pause"),
        ("scheduler", "start-now"),
        ("scheduler", "status"),
        ("scheduler", "tick"),
        ("scheduler", "run-slot", "1"),
        ("web", "serve", "--listen", "127.0.0.1:0"),
        ("cleanup",),
    ],
)
def test_a_state_directory_that_is_a_file_is_named_by_every_command(cli, tmp_path, args):
    path = tmp_path / "not-a-directory"
    path.write_text("x\n")
    result = cli("--json", "--state-dir", str(path), *args)
    assert result.exit_code == 2, result
    assert result.json()["error"]["message"] == (
        f"state directory {path} exists and is not a directory"
    )
    assert path.read_text() == "x\n"


def test_a_scheduler_state_of_another_shape_stops_new_work_until_resumed(cli, upgraded, state_dir):
    (state_dir / "scheduler.json").write_text("[1, 2]")
    result = cli("--json", "status")
    assert result.exit_code == 0, result
    assert result.json()["scheduler"]["paused"] is True
    assert cli("scheduler", "resume").exit_code == 0
    assert json.loads((state_dir / "scheduler.json").read_text())["paused"] is False


@pytest.mark.parametrize(
    "args",
    [
        ("db", "backup", "--to", "{long}.db"),
        ("restore", "--from", "{long}"),
        ("db", "copy", "--to", "sqlite:///{long}.db"),
        ("sandbox", "seed", "--data", "{file}/data"),
        ("sandbox", "seed", "--data", "{file}"),
        ("sandbox", "serve", "--data", "{file}", "--port", "0"),
    ],
)
def test_a_path_the_file_system_cannot_hold_is_named_with_exit_2(cli, upgraded, tmp_path, args):
    """A name longer than the file system takes (255 bytes), or a path through a file: the
    path is named with what is wrong (it was an unexpected OSError, exit 1)."""
    long, file = tmp_path / ("a" * 300), tmp_path / "a-file"
    file.write_text("x\n")
    argv = [a.format(long=long, file=file) for a in args]
    if argv[0] == "restore":
        argv = ["--state-dir", str(tmp_path / "empty"), *argv]
    result = cli("--json", *argv)
    assert result.exit_code == 2, result
    message = result.json()["error"]["message"]
    assert str(long if "{long}" in " ".join(args) else file) in message
    assert message.endswith(
        (
            "a name in it is longer than the file system allows",
            "a part of it is a file, not a directory",
            "exists and is not a directory",
        )
    )


@needs_mounts
def test_units_refused_a_read_only_folder_leave_nothing_made(tmp_path):
    """`scheduler install --dir` names a folder on a read-only file system: refused with
    exit 2, saying so of that folder (not of the state directory), and nothing is made
    for a state directory that did not exist."""
    folder, state = tmp_path / "ro", tmp_path / "fresh-state"
    folder.mkdir()
    done = read_only(
        folder, "--state-dir", str(state), "scheduler", "install", "--dir", str(folder / "u")
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert json.loads(done.stdout)["error"]["message"] == (
        f"{folder / 'u'}: Read-only file system; remount it read-write, or use a path on "
        "another file system"
    )
    assert not state.exists()
