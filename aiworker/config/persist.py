"""Saving the configuration: validated first, atomic, and guarded by a revision."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiworker.config.loader import parse_config, parse_toml, read_config_bytes, revision_of
from aiworker.errors import Conflict, InvalidInput
from aiworker.runtime.atomic import write_private_file
from aiworker.runtime.locks import FileLock

REVISION = re.compile(r"[0-9a-f]{64}|absent")  # what revision_of() gives

SAVE_WAIT_SECONDS = 10.0


def current_config_bytes(path: Path) -> bytes | None:
    """The file a save replaces, as it is now (read bounded); None: there is none yet."""
    path = saved_at(path)
    try:
        return read_config_bytes(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror}") from None


def saved_at(path: Path) -> Path:
    """The file a save replaces: PATH, or the file a symbolic link PATH names (the link
    stays a link); never something that is not a regular file (a directory, a device)."""
    target = path.resolve() if path.is_symlink() else path
    if target.exists() and not target.is_file():
        raise InvalidInput(f"{path}: not a regular file; a configuration is saved to one")
    return target


def save_config_bytes(path: Path, data: bytes, expected_revision: str) -> str:
    """Replace PATH with DATA if its content is still EXPECTED_REVISION; return the new one.

    Invalid DATA raises ConfigInvalid and nothing is written; a concurrent change
    raises Conflict and nothing is written.
    """
    parse_config(data, str(path))  # refused before any lock is waited for
    return save_edit(path, lambda _now: data, expected_revision)[1]


def save_edit(
    path: Path, make: Callable[[bytes | None], bytes], expected_revision: str | None = None
) -> tuple[str, str]:
    """Replace PATH with MAKE(its content as it is under the save lock): an edit made to
    the file as it is, so that edits of other keys saved meanwhile stay. With
    EXPECTED_REVISION, only if the content is still that (else Conflict). Returns (the
    revision before, the new one); nothing is written when MAKE's file is invalid."""
    path = saved_at(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = FileLock(path.with_name(f".{path.name}.lock"), description=f"{path} (being saved)")
    # A save holds the lock for one read and one rename: a second writer waits its turn and
    # then meets the revision check, rather than failing on the lock.
    lock.acquire(timeout=SAVE_WAIT_SECONDS)
    try:
        now = current_config_bytes(path)
        current = revision_of(now)
        if expected_revision is not None and current != expected_revision:
            raise Conflict(
                f"{path} changed since revision {expected_revision[:12]} "
                f"(now {current[:12]}); re-read it and try again"
            )
        data = make(now)
        parse_config(data, str(path))
        write_private_file(path, data)
    finally:
        lock.release()
    return current, revision_of(data)


def parse_value(raw: str) -> Any:
    """A TOML value (number, boolean, array, quoted string); anything else is a bare string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
    except RecursionError:
        raise InvalidInput("the value is nested too deeply to be a setting") from None


def edited(data: bytes | None, path: Path, changes: dict[str, Any]) -> bytes:
    """The file DATA with CHANGES (dotted key -> value; None removes the key) made in
    place: comments, order and formatting of everything else are kept (tomlkit)."""
    import tomlkit
    from tomlkit.exceptions import ConvertError

    if data:
        parse_toml(data, str(path))  # a broken file is refused with the loader's own words
    text = data.decode("utf-8") if data else ""
    document = tomlkit.parse(text)
    for key, value in changes.items():
        parts = key.split(".")
        if not all(parts):
            raise InvalidInput(f"invalid key {key!r}: use dotted names such as forge.url")
        table: Any = document
        for part in parts[:-1]:
            if part not in table:
                table[part] = tomlkit.table()
            table = table[part]
            if not isinstance(table, dict):
                raise InvalidInput(f"invalid key {key!r}: {part!r} is not a table")
        if value is None:
            table.pop(parts[-1], None)
            continue
        try:
            table[parts[-1]] = value
        except (ConvertError, TypeError, ValueError) as exc:
            raise InvalidInput(f"{key}: this value cannot be saved: {exc}") from None
    return tomlkit.dumps(document).encode("utf-8")


def set_config_value(
    path: Path, key: str, raw_value: str, expected_revision: str | None
) -> tuple[str, str]:
    """Set dotted KEY to RAW_VALUE; return (old revision, new revision)."""
    if expected_revision is not None and not REVISION.fullmatch(expected_revision):
        raise InvalidInput(
            f"--if-revision {expected_revision[:80]!r} is not a revision: give the 64 hex "
            "digits `aiworker config show` prints as its revision"
        )
    value = parse_value(raw_value)
    return save_edit(path, lambda now: edited(now, path, {key: value}), expected_revision)
