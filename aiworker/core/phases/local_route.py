"""A local model's try goes through a gate that bounds it (runtime/model_gate.py): the
gate is opened before the workspace (a guest forwards its model address to it), the
provider is pointed at it, and what the try used is recorded on its attempt. A try the
gate or its wall time ended fails as over its bound, whatever the agent printed."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

from aiworker.core.phases.run import Bound, RunReport
from aiworker.runtime.model_gate import ModelGate, RouteUse
from aiworker.runtime.workspace import ExecutionBackend
from aiworker.store.attempts import record_attempt_use
from aiworker.store.engine import Database


@dataclass
class LocalRoute:
    gate: ModelGate
    provider: Any  # the provider pointed at the gate
    bound: Bound

    @classmethod
    def open(cls, provider: Any, backend: ExecutionBackend) -> LocalRoute | None:
        """The route for PROVIDER if it is a local model server, else None."""
        through = getattr(provider, "through", None)
        base_url = getattr(provider, "base_url", None)
        if through is None or base_url is None:
            return None
        cancel = threading.Event()
        gate = ModelGate(base_url, provider.bounds, cancel)
        backend.route_model(gate.target)
        return cls(gate, through(gate.url), Bound(provider.bounds.seconds_per_try, cancel))

    def close(self) -> RouteUse:
        return self.gate.close()


def route_outcome(
    db: Database, attempt: int, run: RunReport, used: RouteUse, seconds: float
) -> RunReport:
    """RUN as the gate saw it, with its use (tokens, requests, seconds) on the attempt;
    SECONDS: the try's wall time, which ended it if it timed out."""
    bound = used.exceeded
    if bound is None and run.timed_out:
        bound = f"the try's {seconds:g} s"
        used.exceeded = bound
    with db.write() as session:
        record_attempt_use(session, attempt, used.as_dict())
    if bound is None:
        return run
    return replace(
        run, result=None, failure="over_bound", reason=f"the local try was stopped at {bound}"
    )
