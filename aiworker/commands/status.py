"""`aiworker status`: why work moves or not, then slots, then tasks by state."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit

EveryState = Annotated[
    bool, typer.Option("--all", help="List every task state, also those with no task.")
]


def status(ctx: typer.Context, every_state: EveryState = False) -> None:
    """The scheduler (running or paused, the last and next check, poll failures), the
    slots and their jobs, then the task states that hold tasks."""
    from aiworker.core.scheduling.overview import collect_status

    inv: Invocation = ctx.obj
    report = collect_status(inv.environment()).to_json()

    def human(console: Any) -> None:
        from aiworker.humanize import both, fold, table

        for line in scheduler_lines(report["scheduler"]):
            console.print(fold(line), markup=False)
        if report["low_space"]:
            console.print(fold(f"Storage: nothing new starts: {report['low_space']}"), markup=False)
        for provider, why in report["isolation"].items():
            console.print(fold(f"Provider {provider} cannot run: {why}"), markup=False)
        for held in report["held"]:
            line = (
                f"Held for you: task {held['task']} since {both(held['since'])}: {held['reason']}"
            )
            console.print(fold(line), markup=False)
        title = f"Slots of controller {report['controller']}"
        slots = table("slot", "busy", "holder pid", "task", "task state", title=title)
        for slot in report["slots"]:
            slots.add_row(
                str(slot["slot"]),
                "yes" if slot["busy"] else "no",
                str(slot["holder_pid"] or "-"),
                str(slot["task_id"] or "-"),
                slot["task_state"] or "-",
            )
        console.print(slots)
        others = [c for c in report["controllers"] if c["id"] != report["controller"]]
        if others:
            hosts = table("controller", "last seen", "claims", title="Other controllers")
            for other in others:
                age = other["seen_age_s"]
                held = ", ".join(f"task {c['task']} on slot {c['slot']}" for c in other["claims"])
                hosts.add_row(other["id"], "never" if age is None else f"{age} s ago", held or "-")
            console.print(hosts)
        kept = report["artifacts"]
        console.print(
            f"Artifacts: {kept['payloads']} payloads, {kept['bytes'] / 2**20:.1f} MiB; the "
            f"next retention pass removes {kept['removable']}",
            markup=False,
        )
        shown = {s: n for s, n in report["tasks"].items() if n or every_state}
        if not shown:
            console.print("Tasks: none", markup=False)
            return
        tasks = table("state", "tasks", title=f"Tasks ({report['total_tasks']})")
        for state, count in shown.items():
            tasks.add_row(state, str(count))
        console.print(tasks)

    emit(inv.json, report, human)


def scheduler_lines(scheduler: dict[str, Any]) -> list[str]:
    """The scheduler in words: its state, the last and next check, the polls."""
    from aiworker.humanize import ago, both

    if scheduler["paused"]:
        by = f" by {scheduler['paused_by']}" if scheduler["paused_by"] else ""
        since = f" since {both(scheduler['paused_at'])}" if scheduler["paused_at"] else ""
        why = scheduler["paused_reason"] or "no reason given"
        lines = [f"Scheduler: PAUSED{by}{since}: {why}"]
    else:
        lines = ["Scheduler: running"]
    last = f"Last check: {both(scheduler['last_check'])}"
    if scheduler["overdue"]:
        last += f"; OVERDUE (interval {scheduler['check_interval_s']} s): is the timer running?"
    lines.append(last)
    if scheduler["next_check"]:
        asked = scheduler["check_requested"]
        lines.append(f"Next check: {'asked for' if asked else ago(scheduler['next_check'])}")
    if scheduler["poll_error"]:
        lines.append(
            f"Polls failing: {scheduler['poll_failures']} in a row, the last "
            f"{ago(scheduler['poll_error_at'])}: {scheduler['poll_error']}"
        )
    return lines
