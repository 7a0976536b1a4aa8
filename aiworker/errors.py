"""The one error tree: every expected failure carries a stable code and an exit code.

Exit codes follow DESIGN.md: 1 the operation failed, 2 usage/configuration/input
invalid, 75 temporarily unavailable (a lock is held, nothing eligible now), 77 refused (a
runner's token is not accepted, or the server speaks no contract the runner does).
"""

from __future__ import annotations

import errno
import os
import signal

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_UNAVAILABLE = 75
EXIT_REFUSED = 77  # not permitted: a refused credential or a contract this side does not speak


def key_path(loc: tuple[int | str, ...]) -> str:
    """A validation location as an operator writes it: repositories[0].index."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def failure_reason(exc: BaseException) -> str:
    """One line that says why a unit of work failed: an expected error's message, the
    signal that stopped it, else the unexpected exception's type and first line."""
    if isinstance(exc, AiworkerError):
        return exc.message
    if isinstance(exc, Interrupted):
        return str(exc)
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"unexpected {type(exc).__name__}: {first}"[:500]


class Interrupted(BaseException):
    """A termination signal arrived while a unit of work ran (runtime/interrupts.py)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class AiworkerError(Exception):
    """Base of every error the CLI turns into one sentence and an exit code."""

    code = "failed"
    exit_code = EXIT_FAILED
    # The installation's fault (a credential the forge refuses), not the work's: a phase
    # that meets it before any inference gets its attempt back.
    installation = False
    # Only a person can mend it: a phase that meets it holds its task for them, whatever
    # it spent, instead of trying again until its budget is spent.
    holds_task = False

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidInput(AiworkerError):
    """Usage, configuration or input is invalid; nothing was changed."""

    code = "invalid_input"
    exit_code = EXIT_INVALID


class NotFound(InvalidInput):
    """What the command names does not exist (a task id, say): exit 2, and 404 on the web."""

    code = "not_found"


class ConfigInvalid(InvalidInput):
    code = "config_invalid"

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class ControllerIdInUse(InvalidInput):
    """Another installation renews this controller.id: both would take the other's work
    for their own."""

    code = "controller_id_in_use"


class SchemaMismatch(InvalidInput):
    """The database schema is newer than this code, or not yet migrated."""

    code = "schema_mismatch"


class StateUnusable(InvalidInput):
    """The state directory or the database file cannot be used as it is; nothing changed."""

    code = "state_unusable"


class Unavailable(AiworkerError):
    """Try again later: a lock is held or nothing is eligible now."""

    code = "unavailable"
    exit_code = EXIT_UNAVAILABLE


class LockHeld(Unavailable):
    code = "lock_held"


class DiskFull(Unavailable):
    """A write found no space (or quota) left: the installation's to fix, not the work's."""

    code = "disk_full"


class ShortOfResources(Unavailable):
    """This host had none left of what it lends every process (file descriptors,
    processes, memory) for the moment: the installation's to raise or wait out."""

    code = "short_of_resources"


SHORT_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM)
SHORT_WORDS = frozenset(os.strerror(number) for number in SHORT_ERRNOS)
SHORT_ADVICE = "this host is short of file descriptors, processes or memory; raise its limits"


def short_of(exc: OSError, what: str) -> ShortOfResources | None:
    """WHAT failed for want of what the host lends (EXC says so), or None."""
    if exc.errno not in SHORT_ERRNOS:
        return None
    return ShortOfResources(f"{what}: {exc.strerror}; {SHORT_ADVICE}")


def out_of_descriptors(needed: int = 4) -> bool:
    """Whether this process cannot open NEEDED files now (SQLite's "unable to open
    database file" hides the errno, and a live database takes three: itself, its log and
    its shared memory)."""
    opened: list[int] = []
    try:
        for _ in range(needed):
            opened.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as exc:
        return exc.errno in (errno.EMFILE, errno.ENFILE)
    finally:
        for fd in opened:
            os.close(fd)
    return False


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_WORDS = ("no space left on device", "disk quota exceeded", "disk is full", "out of diskspace")


def says_disk_full(stderr: str) -> bool:
    """Whether a local tool's STDERR (git's) says the disk is full; a forge's words, on
    git's `remote:` lines, are about the forge's disk."""
    own = [line for line in stderr.lower().splitlines() if not line.startswith("remote:")]
    return any(word in line for line in own for word in FULL_WORDS)


def disk_full(exc: BaseException, *, words: bool = False) -> bool:
    """Whether EXC, or what it was raised from, is a write that found this host's disk
    full: a DiskFull, or an OSError that says so. WORDS: also an error that only carries a
    tool's words for it, which may be about another machine's disk (a guest's, the
    forge's): for a caller that knows this host is short of space."""
    seen: BaseException | None = exc
    for _ in range(8):  # the chain of causes, not a cycle of them
        if seen is None:
            return False
        if isinstance(seen, DiskFull) or getattr(seen, "errno", None) in FULL_ERRNOS:
            return True
        if words and says_disk_full(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Conflict(AiworkerError):
    """Someone else changed the thing first (a stale revision or version)."""

    code = "conflict"


class NeedsPerson(Conflict):
    """A person acted on the forge against the task's work (closed its issue or its pull
    request, pushed to its branch, pointed the pull request at another branch or rewrote
    that branch): trying again cannot mend that, so the task is held until a person
    decides."""

    code = "needs_person"
    holds_task = True


class Refused(AiworkerError):
    """The other side refuses this caller or speaks no common contract; retrying won't help."""

    code = "refused"
    exit_code = EXIT_REFUSED
