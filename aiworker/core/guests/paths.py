"""Where guest images and running guests live (cheap to import: the tick looks here),
and handing what root made there to the service that owns the state directory."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from aiworker.core.context import Environment

log = logging.getLogger(__name__)


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
        owner = os.stat(env.state_dir, follow_symlinks=False)
    except OSError:
        return
    if os.geteuid() != 0 or owner.st_uid == 0 or not stat.S_ISDIR(owner.st_mode):
        return
    tops = [env.state_dir / "locks", guests_root(env)]
    for top in tops:
        if top.parent != env.state_dir:
            continue  # a guests_dir elsewhere is the operator's to own as they chose
        # Walked by open directories, never through a link: the service user may have
        # put one in place of any folder here, and root must not hand over its target.
        for _path, dirs, files, folder in os.fwalk(top, follow_symlinks=False):
            _give(folder, None, owner)
            for name in (*dirs, *files):
                _give(folder, name, owner)


def _give(folder: int, name: str | None, owner: os.stat_result) -> None:
    """Hand NAME in the open FOLDER (the folder itself: None) to OWNER, when root made it."""
    try:
        if name is None:
            if os.fstat(folder).st_uid == 0:
                os.fchown(folder, owner.st_uid, owner.st_gid)
        elif os.stat(name, dir_fd=folder, follow_symlinks=False).st_uid == 0:
            os.chown(name, owner.st_uid, owner.st_gid, dir_fd=folder, follow_symlinks=False)
    except OSError as exc:  # gone meanwhile (a guest's folder), or refused: the rest goes on
        log.warning("could not hand %s to the state directory's owner: %s", name, exc.strerror)
