"""`aiworker doctor`: check configuration, tokens, state, database, git, qemu and KVM."""

from __future__ import annotations

from typing import Any

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit

_STYLE = {"ok": "green", "warn": "yellow", "fail": "red"}


def doctor(ctx: typer.Context) -> int:
    """Run every health check; exit 1 when any check fails."""
    from aiworker.core.maintenance.doctor import run_doctor

    inv: Invocation = ctx.obj
    result = run_doctor(inv.state_dir.absolute(), inv.config_path, inv.config_required)

    def human(console: Any) -> None:
        from rich.markup import escape

        for check in result.checks:
            style = _STYLE[check["status"]]
            console.print(
                f"[{style}]{check['status']:>4}[/{style}]  {check['name']:<14} "
                f"{escape(check['detail'])}"
            )

    emit(inv.json, result.to_json(), human)
    return result.exit_code
