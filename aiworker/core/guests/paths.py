"""Where guest images and running guests live (cheap to import: the tick looks here),
and handing what root made there to the service that owns the state directory."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from aiworker.core.context import Environment


def guests_root(env: Environment) -> Path:
    configured = env.loaded.config.execution.guests_dir
    if configured is None:
        return env.state_dir / "guests"
    path = Path(configured).expanduser()
    return path if path.is_absolute() else env.loaded.path.parent / path


@contextlib.contextmanager
def for_the_owner(env: Environment) -> Iterator[None]:
    """Root builds images for the service user's state directory (provisioning needs
    root): what it made there (locks, images, keys, saved states) is handed to the
    directory's owner as it ends, built or failed, so that the service is not shut out
    of its own locks and guests."""
    try:
        yield
    finally:
        _hand_back(env)


def _hand_back(env: Environment) -> None:
    try:
        owner = env.state_dir.stat()
    except FileNotFoundError:
        return
    if os.geteuid() != 0 or owner.st_uid == 0:
        return
    for top in (env.state_dir / "locks", guests_root(env)):
        for folder, dirs, files in os.walk(top):  # symbolic links are not followed
            for name in (".", *dirs, *files):
                path = os.path.join(folder, name)
                if os.lstat(path).st_uid == 0:  # made by this run, not another user's
                    os.lchown(path, owner.st_uid, owner.st_gid)
