"""The remote snapshot manifest (`ait.runner.snapshot.v1`): the exact tree of a commit as
git trees and blobs, with the blobs' bytes in packs named by their SHA-256.

A runner trusts nothing here: every tree and blob is hashed again as git hashes it, every
pack against its SHA-256, and the tree it writes is hashed once more from disk.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, StringConstraints

from aiworker.contracts.base import Contract
from aiworker.errors import AiworkerError

SNAPSHOT_CONTRACT: Final = "ait.runner.snapshot.v1"
ObjectId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Name = Annotated[str, StringConstraints(min_length=1, max_length=255)]
# Git's modes: a file, an executable, a symbolic link, a directory, a locked external tree.
Mode = Literal["100644", "100755", "120000", "40000", "160000"]


class TreeEntry(Contract):
    name: Name
    mode: Mode
    id: ObjectId


class BlobRecord(Contract):
    pack: Annotated[int, Field(ge=0)]
    offset: Annotated[int, Field(ge=0)]
    size: Annotated[int, Field(ge=0)]


class PackRecord(Contract):
    size: Annotated[int, Field(ge=0)]
    sha256: Sha256


class SnapshotManifest(Contract):
    contract: Literal["ait.runner.snapshot.v1"] = SNAPSHOT_CONTRACT
    snapshot_id: ObjectId  # the root tree's id
    trees: dict[ObjectId, list[TreeEntry]]
    blobs: dict[ObjectId, BlobRecord]
    packs: list[PackRecord]
    file_count: Annotated[int, Field(ge=0)]
    total_bytes: Annotated[int, Field(ge=0)]


NAME_MAX = 255  # bytes: what a runner's file system takes
# A runner's refusals of a snapshot for what the tree holds (not for a damaged transfer).
TREE_REFUSALS = frozenset(
    {
        "snapshot_too_deep",
        "snapshot_too_large",
        "snapshot_external_unlocked",
        "snapshot_path_escape",
    }
)


class Uncheckable(AiworkerError):
    """A commit whose tree no runner can write (a name that is not UTF-8 or too long, a
    tree too deep or too large): the work is refused; its checks never ran."""

    code = "uncheckable_tree"

    def __init__(self, message: str) -> None:
        super().__init__(message[:300])
