"""A provider's login, lent to one run: copied from its persistent home into a private
home for the run (a folder of the workspace, or a tmpfs in a guest), and a refreshed
credential adopted back only when it still names the same identity.

Credential files are those whose name says so (auth, credential, token); the identity
is the set of account fields they hold (account ids, user ids, e-mail addresses). A run
that logged into another account, or dropped the identity, changes nothing on the host.
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
CREDENTIAL_NAME = re.compile(r"auth|credential|token", re.IGNORECASE)
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
    """Write back into SOURCE the credential files the run changed, if the identity held."""
    changed = {p: data for p, data in after.items() if before.get(p) != data}
    if not changed:
        return "unchanged"
    if identity(after) != identity(before):
        log.warning("a run changed the login in %s to another identity; not adopted", source)
        return "identity changed: not adopted"
    for relative, data in sorted(changed.items()):
        target = source / relative
        if source.resolve() not in target.resolve().parents:
            continue
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private_file(target, data)
    return f"adopted {len(changed)} refreshed credential file(s)"
