"""Which phase runs next for a task, and the command that runs it."""

from __future__ import annotations

import sys

from aiworker.core.context import Environment
from aiworker.core.phases.table import COMMANDS, SLOT, claimable_kinds, starting

# Phase commands this version provides: `aiworker <phase> --task ID [--slot N]`.
BUILTIN_PHASES: frozenset[str] = frozenset(COMMANDS)


def phase_command(env: Environment, phase: str) -> list[str] | None:
    override = env.loaded.config.scheduler.phase_commands.get(phase)
    if override:
        return list(override)
    if phase in BUILTIN_PHASES:
        return [*aiworker_argv(env), phase]
    return None


def aiworker_argv(env: Environment) -> list[str]:
    """`aiworker` with the same state and configuration as this process, however they were
    given (a missing default configuration stays embedded defaults)."""
    argv = [sys.executable, "-m", "aiworker", "--state-dir", str(env.state_dir)]
    if env.loaded.exists:
        argv += ["--config", str(env.loaded.path)]
    return argv


def runnable_kinds(env: Environment) -> tuple[list[str], dict[str, str]]:
    """Task kinds whose next phase can run now, and why the others cannot."""
    kinds, skipped = [], {}
    for kind, phase in claimable_kinds().items():
        if phase_command(env, phase.command) is None:
            skipped[kind] = f"phase {phase.command!r} is not available in this version"
        else:
            kinds.append(kind)
    return kinds, skipped


def argv_for(env: Environment, kind: str, state: str, task_id: int, slot: int) -> list[str]:
    """The slot job for a claimed task: its kind's next phase, or a repair episode."""
    phase = starting(SLOT, kind, state)
    command = None if phase is None else phase_command(env, phase.command)
    if phase is None or command is None:
        raise LookupError(f"no slot phase runs a {kind} task that is {state}")
    return [*command, "--task", str(task_id), "--slot", str(slot)]
