"""Requests that wait on the forge for long (an access check or repair: a read of every
bot on every repository) run on a few threads of their own. Every other request runs on
the event loop's shared pool: were the forge to stall, forty such requests held there
would leave no thread for the page, its status, or anything else, until it answered."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")
FORGE_THREADS = 4  # requests waiting on the forge at once; more queue behind them


class ForgeCalls:
    def __init__(self) -> None:
        self.limiter = anyio.CapacityLimiter(FORGE_THREADS)

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(functools.partial(call, *args), limiter=self.limiter)
