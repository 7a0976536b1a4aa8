"""A provider's login, lent to one run: copied from its persistent home into a private
home for the run (a folder of the workspace, or a tmpfs in a guest), and a refreshed
credential adopted back only when it still names the same identity.

Credential files are JSON files whose name says so (auth, credential, token); the
identity is the set of account fields they hold (account ids, user ids, e-mail
addresses). Only files the host lent are taken back, only when they still name the same,
known identity, and only where the host's copy is still the one lent (a concurrent run
that refreshed it first wins). Anything else changes nothing on the host.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiworker.runtime.atomic import write_private_file

log = logging.getLogger(__name__)
CREDENTIAL_NAME = re.compile(r"(auth|credential|token)[^/]*\.json$", re.IGNORECASE)
IDENTITY_KEYS = frozenset(
    {
        "account_id",
        "accountid",
        "account_uuid",
        "accountuuid",
        "user_id",
        "userid",
        "email",
        "email_address",
        "organization_uuid",
        "organizationuuid",
        "sub",
    }
)
MAX_CREDENTIAL_BYTES = 1 << 20


def is_credential(relative: str) -> bool:
    return CREDENTIAL_NAME.search(Path(relative).name) is not None


def credential_files(home: Path) -> dict[str, bytes]:
    """Credential files under HOME by relative path (links are not followed)."""
    found: dict[str, bytes] = {}
    if not home.is_dir():
        return found
    for path in home.rglob("*"):
        relative = str(path.relative_to(home))
        if path.is_symlink() or not path.is_file() or not is_credential(relative):
            continue
        if path.stat().st_size <= MAX_CREDENTIAL_BYTES:
            found[relative] = path.read_bytes()
    return found


def _values(document: Any) -> Iterable[str]:
    if isinstance(document, dict):
        for key, value in document.items():
            if key.lower() in IDENTITY_KEYS and isinstance(value, str | int):
                yield f"{key.lower()}={value}"
            else:
                yield from _values(value)
    elif isinstance(document, list):
        for item in document:
            yield from _values(item)


def identity(files: dict[str, bytes]) -> frozenset[str]:
    found: set[str] = set()
    for data in files.values():
        try:
            found.update(_values(json.loads(data)))
        except ValueError:
            continue
    return frozenset(found)


def copy_home(source: Path, target: Path) -> None:
    """SOURCE's tree (links kept as links) into a new private TARGET."""
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True)
        os.chmod(target, 0o700)
    else:
        target.mkdir(mode=0o700, parents=True)


def adopt(source: Path, before: dict[str, bytes], after: dict[str, bytes]) -> str:
    """Write back into SOURCE the lent credential files the run refreshed, if they still
    name the same identity and the host's copies are still the ones lent."""
    changed = {p: data for p, data in after.items() if p in before and before[p] != data}
    if not changed:
        return "unchanged"
    known = identity(before)
    if not known or identity(after) != known:
        log.warning("a run changed the login in %s to another or no identity; not adopted", source)
        return "identity changed or unknown: not adopted"
    adopted = 0
    for relative, data in sorted(changed.items()):
        target = source / relative
        if source.resolve() not in target.resolve().parents:
            continue
        try:
            if target.read_bytes() != before[relative]:
                continue  # refreshed on the host meanwhile: that one stays
        except OSError:
            continue
        write_private_file(target, data)
        adopted += 1
    return f"adopted {adopted} refreshed credential file(s)"
