"""Git's object ids computed here (blobs, trees, a directory on disk) and a commit's tree
read out of a repository with two git processes, however many files it has."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

TREE_MODE = "40000"
LINK_MODE = "120000"
GITLINK_MODE = "160000"


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def file_blob_id(path: str | Path, size: int) -> str:
    """The blob id of a file of SIZE bytes, read in chunks (never whole into memory)."""
    digest = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def tree_id(entries: Iterable[tuple[str, str, str]]) -> str:
    """The id of a tree of (name, mode, id) entries, in git's order (a tree sorts as if its
    name ended in '/')."""

    def key(entry: tuple[str, str, str]) -> bytes:
        name = entry[0].encode()
        return name + b"/" if entry[1] == TREE_MODE else name

    body = b"".join(
        f"{mode} {name}".encode() + b"\0" + bytes.fromhex(oid)
        for name, mode, oid in sorted(entries, key=key)
    )
    return hashlib.sha1(b"tree %d\0" % len(body) + body, usedforsecurity=False).hexdigest()


def directory_tree_id(root: Path, gitlinks: dict[str, str] | None = None) -> str:
    """The tree id git would give ROOT's contents (links not followed; GITLINKS maps a
    relative path to the commit recorded there, its directory not hashed)."""
    links = gitlinks or {}

    def walk(folder: Path, relative: str) -> str:
        entries = []
        with os.scandir(folder) as items:
            for item in items:
                path = f"{relative}{item.name}"
                info = item.stat(follow_symlinks=False)
                if path in links:
                    entries.append((item.name, GITLINK_MODE, links[path]))
                elif stat.S_ISDIR(info.st_mode):
                    entries.append((item.name, TREE_MODE, walk(Path(item.path), path + "/")))
                elif stat.S_ISLNK(info.st_mode):
                    target = os.readlink(os.fsencode(item.path))  # its bytes, UTF-8 or not
                    entries.append((item.name, LINK_MODE, blob_id(target)))
                elif stat.S_ISREG(info.st_mode):
                    mode = "100755" if info.st_mode & 0o100 else "100644"
                    entries.append((item.name, mode, file_blob_id(item.path, info.st_size)))
                else:
                    raise ValueError(f"{path} is neither a file, a directory nor a link")
        return tree_id(entries)

    return walk(root, "")


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the root, '/'-separated
    mode: str
    oid: str


def list_tree(repo: Path, commit: str) -> tuple[str, list[Entry]]:
    """COMMIT's root tree id and every entry below it, trees included."""
    root = _git(repo, "rev-parse", "--verify", "--end-of-options", f"{commit}^{{tree}}")
    root = root.strip()
    listing = _git(repo, "ls-tree", "-r", "-t", "-z", "--full-tree", root.decode())
    entries = []
    for record in listing.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, _kind, oid = meta.decode().split(" ")
        entries.append(Entry(path.decode("utf-8", "surrogateescape"), mode.lstrip("0"), oid))
    return root.decode(), entries


CHUNK = 1 << 20


def read_blobs(repo: Path, oids: list[str]) -> Iterator[tuple[str, int, Iterator[bytes]]]:
    """Each of OIDS with its size and its bytes in chunks (never a whole blob in memory),
    in order, from one `git cat-file --batch`: a blob's chunks are read before the next
    blob is yielded."""
    proc = subprocess.Popen(
        ["git", "-C", str(repo), "cat-file", "--batch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def feed() -> None:
        try:
            for oid in oids:
                stdin.write(oid.encode() + b"\n")
        finally:
            stdin.close()

    def chunks(size: int) -> Iterator[bytes]:
        while size > 0:
            chunk = stdout.read(min(size, CHUNK))
            if not chunk:
                raise ValueError("git cat-file ended in the middle of a blob")
            size -= len(chunk)
            yield chunk

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        for oid in oids:
            header = stdout.readline().split()
            if len(header) != 3 or header[1] != b"blob":
                raise ValueError(f"git has no blob {oid}")
            size = int(header[2])
            body = chunks(size)
            yield oid, size, body
            for _ in body:  # whatever the caller left unread
                pass
            stdout.read(1)
    finally:
        stdout.close()
        proc.wait()
        feeder.join()


def _git(repo: Path, *args: str) -> bytes:
    result = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, check=False, timeout=600
    )
    if result.returncode != 0:
        raise ValueError(f"git {args[0]}: {result.stderr.decode(errors='replace').strip()[:300]}")
    return result.stdout
