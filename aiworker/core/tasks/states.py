"""The task states and the one table of which state may follow which.

Nothing else in the code decides whether a move is allowed: every transition
goes through lifecycle.advance(), which refuses an edge that is not here. A
self-edge (the state stays, its data changes: a recorded scope, a pinned base)
is allowed only where it is listed.
"""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    NEW = "new"
    READY = "ready"
    CLAIMED = "claimed"
    RUNNING = "running"  # the implementation phase holds its slot
    PLANNING = "planning"  # the planning phase holds its slot
    AWAITING_PLAN_APPROVAL = "awaiting_plan_approval"
    MILESTONES = "milestones"  # an approved plan whose milestones run one at a time
    IMPLEMENTED = "implemented"
    AWAITING_CI = "awaiting_ci"
    AWAITING_REVIEW = "awaiting_review"
    REPAIRING = "repairing"  # a repair episode after review findings, red CI or a base move
    APPROVED = "approved"
    NEEDS_INPUT = "needs_input"  # the issue must change before anything is spent
    PAUSED = "paused"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


S = TaskState
TERMINAL = frozenset({S.DONE, S.CANCELLED})
# States in which the task's issue is still being worked on: poll pauses these when
# authorisation is withdrawn, and records their scope when the issue changes.
ACTIVE = frozenset(
    {
        S.NEW,
        S.READY,
        S.CLAIMED,
        S.RUNNING,
        S.PLANNING,
        S.AWAITING_PLAN_APPROVAL,
        S.MILESTONES,
        S.IMPLEMENTED,
        S.AWAITING_CI,
        S.AWAITING_REVIEW,
        S.REPAIRING,
        S.APPROVED,
        S.NEEDS_INPUT,
    }
)
# A process works on the task in these states: a slot's phase or a delivery step.
# Waiting for its next job, not for a person: where a task past its deadline is ended.
AWAITING_WORK = frozenset(
    {S.READY, S.IMPLEMENTED, S.AWAITING_CI, S.AWAITING_REVIEW, S.APPROVED, S.REPAIRING}
    | {S.MILESTONES}
)
HOLDS_SLOT = frozenset({S.CLAIMED, S.RUNNING, S.PLANNING, S.REPAIRING})
# A milestone in one of these keeps its plan's next milestone waiting (store.tasks.IN_FLIGHT).
IN_FLIGHT = frozenset({S.CLAIMED, S.RUNNING, S.REPAIRING, S.AWAITING_CI, S.AWAITING_REVIEW})

# Work past implementation resumes where it was paused: every step re-verifies what it
# relies on (authorisation, scope, base, receipts, the PR head, a plan's approval) before
# it acts; a repair episode waits for a slot again with its request.
RESUMABLE = frozenset(
    {
        S.AWAITING_PLAN_APPROVAL,
        S.MILESTONES,
        S.REPAIRING,
        S.IMPLEMENTED,
        S.AWAITING_CI,
        S.AWAITING_REVIEW,
        S.APPROVED,
    }
)


_LEAVE = {S.PAUSED, S.CANCELLED}  # every active state may be paused or cancelled

EDGES: dict[TaskState, frozenset[TaskState]] = {
    S.NEW: frozenset({S.READY, *_LEAVE}),
    # ready -> ready: poll records a changed scope.
    # ready -> new: a milestone held back while its plan awaits approval again.
    # ready -> failed: its deadline passed (tasks/deadlines.py).
    S.READY: frozenset({S.READY, S.CLAIMED, S.NEEDS_INPUT, S.NEW, S.FAILED, *_LEAVE}),
    # claimed -> ready: released (no provider now, a dead holder); -> failed: budget spent.
    S.CLAIMED: frozenset(
        {S.CLAIMED, S.READY, S.RUNNING, S.PLANNING, S.REPAIRING, S.NEEDS_INPUT, S.FAILED, *_LEAVE}
    ),
    # running -> ready: a retryable failure or an abandoned attempt with budget left.
    S.RUNNING: frozenset({S.RUNNING, S.READY, S.IMPLEMENTED, S.NEEDS_INPUT, S.FAILED, *_LEAVE}),
    S.PLANNING: frozenset(
        {S.PLANNING, S.READY, S.AWAITING_PLAN_APPROVAL, S.NEEDS_INPUT, S.FAILED, *_LEAVE}
    ),
    S.AWAITING_PLAN_APPROVAL: frozenset(
        {S.AWAITING_PLAN_APPROVAL, S.MILESTONES, S.READY, S.FAILED, *_LEAVE}
    ),
    # milestones -> awaiting_plan_approval: the scope changed or the approval was withdrawn;
    # -> repairing: the combined checks fail once every milestone is in.
    S.MILESTONES: frozenset(
        {S.MILESTONES, S.IMPLEMENTED, S.AWAITING_PLAN_APPROVAL, S.REPAIRING, S.FAILED, *_LEAVE}
    ),
    # implemented -> repairing: the base moved and the work must be brought forward;
    # -> done: a milestone accepted into its plan's branch. From here to approved,
    # -> awaiting_plan_approval: a plan whose issue changed after it was approved waits
    # for a writer to approve it again (delivery/scope_check.py).
    S.IMPLEMENTED: frozenset(
        {
            S.IMPLEMENTED,
            S.AWAITING_CI,
            S.REPAIRING,
            S.AWAITING_PLAN_APPROVAL,
            S.DONE,
            S.FAILED,
            *_LEAVE,
        }
    ),
    # awaiting_ci -> awaiting_ci: a CI run died and is retried within its budget.
    # -> done, from here to repairing: a person merged the PR on the forge.
    S.AWAITING_CI: frozenset(
        {S.AWAITING_CI, S.AWAITING_REVIEW, S.REPAIRING, S.AWAITING_PLAN_APPROVAL, S.DONE}
        | {S.FAILED, *_LEAVE}
    ),
    S.AWAITING_REVIEW: frozenset(
        {S.AWAITING_REVIEW, S.APPROVED, S.REPAIRING, S.AWAITING_PLAN_APPROVAL, S.DONE}
        | {S.FAILED, *_LEAVE}
    ),
    S.REPAIRING: frozenset(
        {S.REPAIRING, S.IMPLEMENTED, S.AWAITING_CI, S.NEEDS_INPUT, S.DONE, S.FAILED, *_LEAVE}
    ),
    S.APPROVED: frozenset(
        {S.APPROVED, S.DONE, S.REPAIRING, S.AWAITING_PLAN_APPROVAL, S.FAILED, *_LEAVE}
    ),
    # needs_input -> ready: the issue was fixed (a new scope) or an operator retried it.
    S.NEEDS_INPUT: frozenset({S.NEEDS_INPUT, S.READY, *_LEAVE}),
    # paused -> the state it was paused in, once authorised again, for work past
    # implementation (each step re-verifies its evidence), a plan past planning (its step
    # re-reads the approval) and a repair episode; -> ready for anything earlier.
    S.PAUSED: frozenset({S.PAUSED, S.READY, S.CANCELLED}) | RESUMABLE,
    # failed -> ready: an operator's retry, with the budget reset recorded; -> the state it
    # failed in, for work past implementation (as a resumption: nothing is made again).
    S.FAILED: frozenset({S.READY, S.CANCELLED}) | RESUMABLE,
    S.DONE: frozenset(),
    S.CANCELLED: frozenset(),
}
INITIAL = frozenset({S.NEW, S.READY})


def allowed(from_state: str, to_state: str) -> bool:
    try:
        return TaskState(to_state) in EDGES[TaskState(from_state)]
    except ValueError:
        return False
