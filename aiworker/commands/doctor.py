"""`aiworker doctor`: check configuration, tokens, the forge, the scheduler, state,
database, git, qemu and KVM."""

from __future__ import annotations

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit_health


def doctor(ctx: typer.Context) -> int:
    """Run every health check, the forge's included; exit 1 when any check fails."""
    from aiworker.core.maintenance.doctor import run_doctor

    inv: Invocation = ctx.obj
    result = run_doctor(inv.state_dir.absolute(), inv.config_path)
    emit_health(inv.json, result.to_json())
    return result.exit_code
