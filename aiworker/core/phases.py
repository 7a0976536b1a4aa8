"""Which phase runs next for a task, and the command that runs it."""

from __future__ import annotations

import sys

from aiworker.config.models import Config

# Phase commands this version provides; `aiworker <phase> --task ID --slot N`.
BUILTIN_PHASES: frozenset[str] = frozenset()
NEXT_PHASE = {
    "plan": "plan",
    "milestone": "implement",
    "feature": "implement",
    "issue": "implement",
}


def phase_command(config: Config, phase: str) -> list[str] | None:
    override = config.scheduler.phase_commands.get(phase)
    if override:
        return list(override)
    if phase in BUILTIN_PHASES:
        return [sys.executable, "-m", "aiworker", phase]
    return None


def runnable_kinds(config: Config) -> tuple[list[str], dict[str, str]]:
    """Task kinds whose next phase can run now, and why the others cannot."""
    kinds, skipped = [], {}
    for kind, phase in NEXT_PHASE.items():
        if phase_command(config, phase) is None:
            skipped[kind] = f"phase {phase!r} is not available in this version"
        else:
            kinds.append(kind)
    return kinds, skipped


def argv_for(config: Config, kind: str, task_id: int, slot: int) -> list[str]:
    command = phase_command(config, NEXT_PHASE[kind])
    if command is None:
        raise LookupError(f"no phase command for {kind}")
    return [*command, "--task", str(task_id), "--slot", str(slot)]
