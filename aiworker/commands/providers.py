"""`aiworker providers`: quota readings, headroom and eligibility per phase."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit

app = typer.Typer(
    help="Inspect coding-agent providers and their quota admission.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def _render(report: dict[str, Any]) -> Any:
    def human(console: Any) -> None:
        from rich.table import Table

        if report["suspended"]:
            console.print("no providers configured: inference is suspended", markup=False)
        table = Table(
            "provider",
            "window",
            "used %",
            "resets at",
            "headroom",
            "phase",
            "eligible",
            "reason",
            title="Providers",
        )
        for name, entry in report["providers"].items():
            windows = entry.get("windows") or [{}]
            resets = {w["name"]: w["resets_at"] for w in entry["reading"]["windows"]}
            for phase, verdict in entry["eligible"].items() or [
                ("-", {"eligible": False, "reason": entry["reading"]["reason"]})
            ]:
                for window in windows:
                    table.add_row(
                        name,
                        window.get("name", "-"),
                        str(window.get("used_percent", "-")),
                        str(resets.get(window.get("name"), "-")),
                        str(window.get("headroom", "-")),
                        phase,
                        "yes" if verdict["eligible"] else "no",
                        verdict["reason"],
                    )
        console.print(table)
        for phase, provider in report["phases"].items():
            console.print(f"{phase}: {provider or 'none eligible'}", markup=False)

    return human


@app.command("status")
def status(ctx: typer.Context) -> None:
    """Every configured provider's windows, headroom after the running-job penalty, and
    whether it is eligible for each phase, with the reason."""
    from aiworker.core.providers.registry import providers_status

    inv: Invocation = ctx.obj
    report = providers_status(inv.environment()).to_json()
    emit(inv.json, report, _render(report))


@app.command("check")
def check(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Provider name, e.g. codex or script.")],
) -> None:
    """Read one provider's quota signal now (no inference) and record the observation."""
    from aiworker.core.providers.registry import providers_status

    inv: Invocation = ctx.obj
    report = providers_status(inv.environment(), only=name).to_json()
    emit(inv.json, report, _render(report))
