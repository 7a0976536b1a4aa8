"""`aiworker providers`: quota readings, headroom and eligibility per phase."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from aiworker.errors import EXIT_UNAVAILABLE
from aiworker.invocation import Invocation
from aiworker.render import emit

app = typer.Typer(
    help="Inspect coding-agent providers and their quota admission.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def _render(report: dict[str, Any]) -> Any:
    def human(console: Any) -> None:
        from aiworker.humanize import ago, fold, table

        if report["suspended"]:
            console.print("no providers configured: inference is suspended", markup=False)
        windows = table("provider", "window", "used %", "resets", "headroom", title="Quota")
        verdicts = table("provider", "phase", "eligible", "reason", title="Eligibility")
        for name, entry in report["providers"].items():
            resets = {w["name"]: w["resets_at"] for w in entry["reading"]["windows"]}
            for window in entry.get("windows") or [{}]:
                reset = resets.get(window.get("name"))
                windows.add_row(
                    name,
                    window.get("name", "-"),
                    str(window.get("used_percent", "-")),
                    ago(reset) if reset else "-",
                    str(window.get("headroom", "-")),
                )
            for phase, verdict in entry["eligible"].items() or [
                ("-", {"eligible": False, "reason": entry["reading"]["reason"]})
            ]:
                eligible = "yes" if verdict["eligible"] else "no"
                verdicts.add_row(name, phase, eligible, verdict["reason"])
        console.print(windows)
        console.print(verdicts)
        for name, entry in report["providers"].items():
            reading = entry["reading"]
            if not reading["valid"]:
                line = f"{name}: its signal cannot be read ({reading['source']}): "
                console.print(fold(line + reading["reason"]), markup=False)
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
    """Read one provider's quota signal now (no inference) and record the observation;
    exit 75 when it cannot be read (a local server down, a CLI not logged in)."""
    from aiworker.core.providers.registry import providers_status

    inv: Invocation = ctx.obj
    report = providers_status(inv.environment(), only=name).to_json()
    emit(inv.json, report, _render(report))
    reading = report["providers"][name]["reading"]
    if not reading["valid"]:
        # Its signal cannot be read now (a server down, a login missing): admission
        # skips it until it can, so a script waiting on it can retry later.
        raise typer.Exit(EXIT_UNAVAILABLE)
