"""The one state machine: the edge table is complete, reachable, and the only door."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from aiworker.core.tasks.lifecycle import TransitionRefused, advance
from aiworker.core.tasks.states import EDGES, IN_FLIGHT, INITIAL, TERMINAL, TaskState
from aiworker.store import tasks as store_tasks
from aiworker.store.engine import Database
from aiworker.store.models import Event, Task
from aiworker.store.task_records import create_task, ensure_repository

PACKAGE = Path(__file__).resolve().parent.parent / "aiworker"
STATE_NAMES = {"S", "TaskState"}


def test_every_state_has_edges_and_is_reachable():
    assert set(EDGES) == set(TaskState)
    seen, frontier = set(INITIAL), list(INITIAL)
    while frontier:
        for target in EDGES[frontier.pop()]:
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    assert seen == set(TaskState), f"unreachable: {set(TaskState) - seen}"
    for state in TERMINAL:
        assert EDGES[state] == frozenset(), state
    for state in set(TaskState) - TERMINAL:
        assert TaskState.CANCELLED in EDGES[state], f"{state} cannot be cancelled"


def test_the_store_speaks_the_same_vocabulary():
    assert set(store_tasks.TASK_STATES) == {s.value for s in TaskState}
    assert set(store_tasks.IN_FLIGHT) == {s.value for s in IN_FLIGHT}
    # The claim statements are the one hard-wired edge.
    assert TaskState.CLAIMED in EDGES[TaskState.READY]


def _state_literal(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in STATE_NAMES
    ):
        return TaskState[node.attr].value
    return None


# How each moving call names its edge: (from, to) as argument positions. A phase's moves
# are declared in its table (core/phases/table.py) and checked against the edges there.
MOVERS = {"advance": (2, 4), "try_advance": (2, 4)}


def moves():
    """Every call that moves a task, with the edge it names where it names it literally."""
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in MOVERS
            ):
                source, target = MOVERS[node.func.id]
                yield (
                    path,
                    node,
                    _state_literal(node.args[source]),
                    _state_literal(node.args[target]),
                )


def test_every_literal_edge_in_the_code_is_in_the_table():
    calls = list(moves())
    assert len(calls) >= 20, "advance() should be how every module moves a task"
    literal = 0
    for path, call, source, target in calls:
        if source is not None and target is not None:
            literal += 1
            assert TaskState(target) in EDGES[TaskState(source)], (
                f"{path.name}:{call.lineno}: {source} -> {target} is not in the table"
            )
    assert literal >= 8  # the scan must keep seeing the moves it checks


def test_only_advance_compares_and_updates():
    users = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any(
                alias.name == "compare_and_update" for alias in node.names
            ):
                users.append(path.relative_to(PACKAGE).as_posix())
    assert users == ["core/tasks/lifecycle.py"]


@pytest.fixture
def task_id(upgraded):
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        task = create_task(session, repo.id, "issue", issue_number=3)
        task_id = task.id
    db.dispose()
    return task_id


def test_a_disallowed_edge_is_refused_and_nothing_changes(upgraded, task_id):
    db = Database(f"sqlite:///{upgraded}")
    with pytest.raises(TransitionRefused) as refused, db.write() as session:
        advance(session, task_id, "ready", 1, "done", "skipping the work")
    assert refused.value.refusal.why == "disallowed"
    assert refused.value.message == f"task {task_id}: ready -> done is not an allowed transition"
    with db.read() as session:
        task = session.get(Task, task_id)
        assert (task.state, task.version) == ("ready", 1)
        assert [e.kind for e in session.query(Event).filter(Event.task_id == task_id)] == [
            "task.created"
        ]
    db.dispose()


def test_a_cancelled_task_stays_cancelled(upgraded, task_id):
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        version = advance(session, task_id, "ready", 1, "cancelled", "operator")
    for target in TaskState:
        with pytest.raises(TransitionRefused), db.write() as session:
            advance(session, task_id, "cancelled", version, target, "revive")
    db.dispose()
