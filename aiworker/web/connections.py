"""What a connection may hold of the server: a whole request head within HEAD_S of
opening (or KEEP_ALIVE_S of its last answer), and the process as many file descriptors
as its hard limit allows.

uvicorn starts no timer on a connection until it has answered a request, so a client
that opened connections and sent nothing (or a byte at a time) held them for ever, and
about a thousand of them took every descriptor of the process under systemd's default
limit of 1024: both listeners stopped answering, and runners' heartbeats failed until
their leases were lost.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_S = 10.0  # a request head is a few hundred bytes: ten seconds suit any link
KEEP_ALIVE_S = 75  # an idle connection is kept this long (uvicorn's own default is 5 s)
DESCRIPTORS = 65536  # at most what this process asks for, where its hard limit is higher


def allow_descriptors() -> int:
    """Raise this process's soft limit on open files to its hard limit (at most
    DESCRIPTORS): systemd gives a service 1024 unless told otherwise. The limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, DESCRIPTORS)
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        return wanted
    return soft


class HeadLimited(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose next request head does
    not arrive whole in time."""

    head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._wait_for_head(HEAD_S)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._wait_for_head(KEEP_ALIVE_S)

    def handle_events(self) -> None:
        super().handle_events()
        if self._serving():
            self._stop_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def _serving(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _wait_for_head(self, seconds: float) -> None:
        self._stop_waiting()
        if not self.transport.is_closing():
            self.head_timer = self.loop.call_later(seconds, self._head_late)

    def _stop_waiting(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_late(self) -> None:
        self.head_timer = None
        if not self._serving() and not self.transport.is_closing():
            self.transport.close()
