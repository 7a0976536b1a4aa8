"""advance(): the one way a task changes state.

A transition is a compare-and-update on (state, version) plus an event, inside
the caller's write transaction. A move the edge table does not allow, or one
whose expected state and version are no longer current, is refused with
TransitionRefused, which says what the task is now; nothing is applied. The
phase driver decides what a refusal means for a phase (engine.py); the lifecycle's own
moves that a refusal merely answers (a task that moved on is left as it is) use
try_advance, which returns the Refusal instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec

from aiworker.core.tasks.states import allowed
from aiworker.errors import Conflict
from aiworker.store.tasks import Writer, compare_and_update, task_state

log = logging.getLogger(__name__)
P = ParamSpec("P")


@dataclass(frozen=True)
class Refusal:
    task_id: int
    expected_state: str
    expected_version: int
    to_state: str
    why: str  # disallowed | stale
    actual_state: str | None = None
    actual_version: int | None = None

    def sentence(self) -> str:
        move = f"{self.expected_state} -> {self.to_state}"
        if self.why == "disallowed":
            return f"task {self.task_id}: {move} is not an allowed transition"
        if self.actual_state is None:
            return f"task {self.task_id} does not exist"
        return (
            f"task {self.task_id} is {self.actual_state} at version {self.actual_version}, "
            f"not {self.expected_state} at version {self.expected_version}; {move} refused"
        )


class TransitionRefused(Conflict):
    code = "transition_refused"

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.sentence())
        self.refusal = refusal


def try_advance(
    writer: Writer,
    task_id: int,
    expected_state: str,
    expected_version: int,
    to_state: str,
    reason: str,
    *,
    actor: str | None = None,
    kind: str = "task.transition",
    data: Mapping[str, Any] | None = None,
    follow_data_changes: bool = False,
    **changes: Any,
) -> int | Refusal:
    """Move TASK_ID from EXPECTED_STATE at EXPECTED_VERSION to TO_STATE, recording REASON
    (CHANGES: the task's columns that change with the move); the task's new version, or
    the Refusal, logged and changing nothing, when the edge is not allowed or the task
    moved on meanwhile. For a caller to whom a refusal is an answer (a task that moved
    on is left as it is); advance() raises it instead.

    FOLLOW_DATA_CHANGES: when only the version moved (poll recorded a new scope; the
    state is still the expected one), the move is made against the current version. A
    caller uses it where its decision does not depend on the scope (a failure, a step's
    recorded outcome); a changed state (paused, cancelled) is refused all the same.
    """
    if to_state == "paused" and expected_state != "paused" and kind == "task.transition":
        kind = "task.paused"  # what a resumption reads the state to return to from
    if not allowed(expected_state, to_state):
        refusal = Refusal(task_id, expected_state, expected_version, to_state, "disallowed")
        log.error("%s", refusal.sentence())
        return refusal
    applied = compare_and_update(
        writer,
        task_id,
        expected_version,
        expected_state,
        to_state,
        actor=actor,
        kind=kind,
        data={"reason": reason, **(data or {})},
        **changes,
    )
    actual = None if applied else task_state(writer, task_id)
    if not applied and follow_data_changes and actual and actual[0] == expected_state:
        return try_advance(
            writer,
            task_id,
            expected_state,
            actual[1],
            to_state,
            reason,
            actor=actor,
            kind=kind,
            data=data,
            **changes,
        )
    if not applied:
        refusal = Refusal(
            task_id,
            expected_state,
            expected_version,
            to_state,
            "stale",
            actual[0] if actual else None,
            actual[1] if actual else None,
        )
        log.warning("%s", refusal.sentence())
        return refusal
    log.info("task %d: %s -> %s: %s", task_id, expected_state, to_state, reason)
    return expected_version + 1


def _raising(move: Callable[P, int | Refusal]) -> Callable[P, int]:
    def raising(*args: P.args, **kwargs: P.kwargs) -> int:
        moved = move(*args, **kwargs)
        if isinstance(moved, Refusal):
            raise TransitionRefused(moved)
        return moved

    return raising


# The way a task changes state: try_advance's move, raising TransitionRefused for a
# refusal; returns the task's new version.
advance = _raising(try_advance)
