"""What a failed git command in the cache says, as the error it is: a full disk here, the
forge's refusal (403), an outage on the way to the forge, or anything else."""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

from aiworker.errors import EXIT_INVALID, EXIT_UNAVAILABLE, AiworkerError, DiskFull, says_disk_full
from aiworker.secrets import redact


class GitCacheError(AiworkerError):
    code = "git_cache"


def refuse_full(cache: Path, stderr: str) -> None:
    """Git's failure in CACHE, when it says this host's disk is full (not the forge's,
    whose words come on `remote:` lines): the installation's to fix (exit 75), not a
    failure of the work."""
    if says_disk_full(stderr):
        raise DiskFull(f"git cache {cache}: the disk is full; free space")


class GitForbidden(GitCacheError):
    """The forge answered git with 403: the identity's token lacks the repository scope
    (write:repository to push), or the identity lacks the permission. Only the operator
    can mend that; no retry helps."""

    code = "git_forbidden"
    exit_code = EXIT_INVALID
    installation = True
    holds_task = True


class GitUnreachable(GitCacheError):
    """Git could not get through to the forge for now (a proxy's 5xx or 429, a refused or
    timed-out connection, a connection that broke off): as the API's outage, the task
    waits and is tried again, charged nothing."""

    code = "git_unavailable"
    exit_code = EXIT_UNAVAILABLE


# What git (over curl) says of the HTTP status it got, and of a way to the forge that
# failed without one.
HTTP_STATUS = re.compile(r"returned error: (\d{3})|RPC failed; HTTP (\d{3})")
BROKEN_OFF = re.compile(
    r"Failed to connect to|Empty reply from server|Connection reset by peer|Connection timed "
    r"out|Operation timed out|Recv failure|Send failure|transfer closed with|early EOF"
)


def _outage(stderr: str) -> str | None:
    """Git's words, when they say the forge or the way to it failed for now: a 429 or 5xx,
    or a connection that could not be made or broke off (with no status: a 413 breaks the
    connection off too, and is no outage)."""
    status = HTTP_STATUS.search(stderr)
    if status is not None:
        code = int(status.group(1) or status.group(2))
        return status.group(0) if code == 429 or code >= 500 else None
    broken = BROKEN_OFF.search(stderr)
    return broken.group(0) if broken is not None else None


# An outage under git is waited out without charge this long; one that lasts longer (a
# proxy that always cuts a large fetch off at its read timeout, a forge that always fails
# to pack) is charged, so that the task ends by its budget, seen, instead of being tried
# for ever.
OUTAGE_WAITED_S = 3600.0


def _outage_mark(cache: Path) -> Path:
    return cache.with_name(cache.name + ".outage")


def _outage_lasting(cache: Path) -> float:
    """How long git in CACHE has met outages without getting through (0: the first)."""
    mark = _outage_mark(cache)
    try:
        return max(0.0, time.time() - mark.stat().st_mtime)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            mark.touch()
        return 0.0


def got_through(cache: Path) -> None:
    """Git in CACHE reached the forge: an outage it met is over."""
    with contextlib.suppress(FileNotFoundError):
        _outage_mark(cache).unlink()


def failure(cache: Path, command: str, stderr: str) -> GitCacheError:
    """The error git COMMAND's STDERR in CACHE names (DiskFull is raised, not returned)."""
    refuse_full(cache, stderr)
    if "returned error: 403" in stderr:
        lines = stderr.splitlines()
        said = [x.removeprefix("remote:").strip() for x in lines if x.startswith("remote:")]
        words = next((w for w in said if w), "")  # the forge's own reason, if it gave one
        return GitForbidden(
            f"the forge refused git {command} (HTTP 403"
            + (f": {redact(words)[:200]}" if words else "")
            + "): the repository is archived, this identity's token lacks the "
            "repository scope (write:repository to push), or the identity lacks "
            "permission on it; `aiworker doctor` names which"
        )
    outage = _outage(stderr)
    if outage is not None:
        lasting = _outage_lasting(cache)
        if lasting > OUTAGE_WAITED_S:  # what never passes (a proxy's limit) fails the work
            return GitCacheError(
                f"git {command} has not got through to the forge for {lasting / 60:.0f} "
                f"minutes ({outage}): no longer waited out without charge"
            )
        return GitUnreachable(
            f"git {command} could not get through to the forge ({outage}); it is tried again later"
        )
    detail = stderr.strip().splitlines()[-1:] or ["no output"]
    return GitCacheError(f"git {command} failed in cache {cache.name}: {detail[0][:300]}")
