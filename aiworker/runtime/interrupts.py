"""Termination signals as exceptions: inside `signals_raise()`, a SIGTERM (an operator's
cancel, systemd stopping a unit) or a SIGHUP raises Interrupted in the main thread, so
that it unwinds like any other failure; only SIGKILL skips the unwinding."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

from aiworker.errors import Interrupted

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Raise Interrupted for SIGTERM and SIGHUP in the block; the handlers before it are
    back afterwards."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def ignore_signals() -> None:
    """Ignore SIGTERM and SIGHUP from now on (a clean-up a second signal must not cut
    short); the end of the enclosing `signals_raise()` puts the handlers back."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
