"""The phase table against the lifecycle: every unit of work the tick starts is declared
once, and every move a declaration or a body makes is an edge of the state machine."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from aiworker.cli import main
from aiworker.config.models import PHASES as CONFIG_PHASES
from aiworker.core.phases.table import (
    COMMANDS,
    PHASES,
    SLOT,
    TASK,
    Phase,
    claimable_kinds,
    load,
)
from aiworker.core.tasks.states import EDGES, TaskState, allowed
from aiworker.store.tasks import TASK_KINDS

PACKAGE = Path(__file__).resolve().parent.parent / "aiworker"


def _holds(phase: Phase) -> list[tuple[str, str]]:
    """(start, the state the task holds while the phase runs) for each start."""
    return [(start, phase.holds or start) for start in sorted(phase.starts)]


@pytest.mark.parametrize("phase", PHASES, ids=lambda p: p.name)
def test_every_declared_start_hold_and_landing_is_an_edge(phase):
    for start, holds in _holds(phase):
        assert start in EDGES, f"{phase.name} starts from {start}, which is no state"
        if holds != start:
            assert allowed(start, holds), f"{phase.name}: {start} -> {holds}"
        retry = phase.retry or holds
        if retry != holds:
            assert allowed(holds, retry), f"{phase.name} retries {holds} -> {retry}"
        # A spent budget fails the task from where it held it.
        assert allowed(holds, TaskState.FAILED), f"{phase.name}: {holds} -> failed"


def _modules_of(body: str) -> list[Path]:
    """The body's module and the phase and delivery modules it takes decisions from."""
    module = body.partition(":")[0]
    paths = [PACKAGE / "core" / (module.replace(".", "/") + ".py")]
    for node in ast.walk(ast.parse(paths[0].read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            ("aiworker.core.phases.", "aiworker.core.delivery.")
        ):
            paths.append(PACKAGE.parent / (node.module.replace(".", "/") + ".py"))
    return paths


def _landings(body: str) -> set[str]:
    """The states a body names as an Outcome's destination (or through reports.ended),
    where it names them literally."""
    found = set()
    nodes = [n for path in _modules_of(body) for n in ast.walk(ast.parse(path.read_text()))]
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id not in ("Outcome", "ended") or len(node.args) < 2:
            continue
        state = node.args[1]
        named = isinstance(state, ast.Attribute) and isinstance(state.value, ast.Name)
        if named and state.value.id in ("S", "TaskState"):
            found.add(TaskState[state.attr].value)
    return found


@pytest.mark.parametrize("phase", PHASES, ids=lambda p: p.name)
def test_every_landing_a_body_names_is_an_edge_from_what_the_phase_holds(phase):
    landings = _landings(phase.body)
    holds = {held for _, held in _holds(phase)}
    for landing in landings:
        assert any(allowed(held, landing) or held == landing for held in holds), (
            f"{phase.name}'s body lands its task in {landing}, no edge from {sorted(holds)}"
        )


def test_the_scan_sees_the_bodies_landings():
    assert {"implemented", "needs_input", "failed"} <= _landings(COMMANDS["implement"].body)
    assert "done" in _landings(COMMANDS["merge"].body)


@pytest.mark.parametrize("phase", PHASES, ids=lambda p: p.name)
def test_every_declaration_names_a_body_and_a_command_that_exist(phase, capsys):
    assert callable(load(phase.body))
    if phase.abandoned:
        assert callable(load(phase.abandoned))
    assert main([phase.command, "--help"]) == 0
    shown = capsys.readouterr().out
    assert "--task" in shown
    assert ("--slot" in shown) == (phase.lock == SLOT)
    assert phase.lock in (SLOT, TASK)
    assert set(phase.kinds) <= set(TASK_KINDS)


def _units_the_commands_run() -> set[str]:
    """Every phase or step a command runs through the driver: run_unit(inv, NAME, ...), or
    run_step(inv, NAME, ...) for a delivery step."""
    names = set()
    for path in (PACKAGE / "commands").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("run_unit", "run_step")
                and isinstance(node.args[1], ast.Constant)
            ):
                names.add(node.args[1].value)
    return names


def test_every_unit_a_command_runs_is_declared_and_every_declaration_is_run():
    assert _units_the_commands_run() == set(COMMANDS)


def test_every_kind_is_claimed_into_a_declared_slot_phase():
    claimed = claimable_kinds()
    assert set(claimed) == set(TASK_KINDS)
    for kind, phase in claimed.items():
        assert phase.lock == SLOT, (kind, phase.name)
        assert TaskState.CLAIMED in phase.starts, (kind, phase.name)


def test_only_the_driver_handles_a_refused_move():
    """A refused move is the driver's to handle: no other module catches it, and advance()
    is called only by the driver and the lifecycle's own modules."""
    catching, advancing = [], []
    allowed_advance = ("core/phases/engine.py", "core/intake/recording.py")
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler) and "TransitionRefused" in ast.unparse(
                node.type or ast.Constant(None)
            ):
                catching.append(where)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "advance"
                and not (where.startswith("core/tasks/") or where in allowed_advance)
            ):
                advancing.append(where)
    assert catching == ["core/phases/engine.py"]
    assert advancing == []


def test_every_phase_command_an_operator_may_replace_is_a_declared_unit():
    """scheduler.phase_commands is validated against the configuration's own list of
    phases (the configuration loads before the workflow): each must be declared here."""
    assert set(CONFIG_PHASES) <= set(COMMANDS)
    assert set(COMMANDS) - set(CONFIG_PHASES) == {"ci"}  # its command is not replaceable
