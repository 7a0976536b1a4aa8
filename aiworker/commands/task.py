"""`aiworker task`: list, show, retry and cancel tasks."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from aiworker.invocation import Invocation
from aiworker.render import emit

app = typer.Typer(help="Inspect and steer tasks.", no_args_is_help=True, rich_markup_mode=None)


@app.command("list")
def list_(
    ctx: typer.Context,
    state: Annotated[str | None, typer.Option("--state", help="Only tasks in this state.")] = None,
    after: Annotated[int, typer.Option("--after", min=0, help="Only tasks with a larger id.")] = 0,
) -> None:
    """Tasks by id with their kind, issue and state (500 per page; --after continues)."""
    from aiworker.core.tasks.inspect import list_task_rows

    inv: Invocation = ctx.obj
    report = list_task_rows(inv.environment(), state, after=after).to_json()

    def human(console: Any) -> None:
        for t in report["tasks"]:
            console.print(
                f"{t['id']:>5} {t['state']:<22} {t['kind']:<9} {t['repository']}#{t['issue']} "
                f"{t['title']}",
                markup=False,
            )
        if not report["tasks"]:
            console.print("no tasks", markup=False)

    emit(inv.json, report, human)


@app.command("show")
def show(ctx: typer.Context, task: Annotated[int, typer.Argument(min=1, help="Task id.")]) -> None:
    """One task: state, its history of events, attempts, budgets, receipts, publication,
    and where its files are."""
    from aiworker.core.tasks.inspect import show_task

    inv: Invocation = ctx.obj
    report = show_task(inv.environment(), task).to_json()

    def human(console: Any) -> None:
        lines = [
            f"task {report['id']} ({report['kind']}) {report['repository']}#{report['issue']}: "
            f"{report['title']}",
            f"state {report['state']} (version {report['version']}); base {report['base']}; "
            f"head {report['head']}",
            "history:",
            *(_event_line(e) for e in report["history"]),
            "attempts:",
            *(
                f"  {a['id']} {a['phase']} {a['provider'] or 'host'}: {a['outcome']}"
                + (f" ({a['reason']})" if a["reason"] else "")
                for a in report["attempts"]
            ),
            "budgets: "
            + (
                ", ".join(f"{k} {v['used']}/{v['limit']}" for k, v in report["budgets"].items())
                or "none used"
            ),
            *(
                f"receipt: {r['phase']} {r['check'] or ''} {r['outcome']} at {r['head']}"
                for r in report["receipts"]
            ),
            *(
                f"publication: {p['state']} {p['branch']} PR #{p['pr']}"
                for p in report["publications"]
            ),
            *(f"file: {f}" for f in report["files"]),
        ]
        console.print("\n".join(lines), markup=False)

    emit(inv.json, report, human)


def _event_line(event: dict[str, Any]) -> str:
    line = f"  {event['at']} {event['kind']}"
    if event["to"]:
        line += f" {event['from'] or ''} -> {event['to']}".replace("  ", " ")
    data = event["data"]
    if data.get("phase"):
        line += f" [{data['phase']}" + (f" #{data['attempt']}]" if data.get("attempt") else "]")
    return line + (f": {data['reason']}" if data.get("reason") else "")


@app.command("retry")
def retry(ctx: typer.Context, task: Annotated[int, typer.Argument(min=1, help="Task id.")]) -> None:
    """Put a failed or needs_input task back to ready, resetting its budgets (recorded)."""
    from aiworker.core.tasks.operator import retry_task

    inv: Invocation = ctx.obj
    report = retry_task(inv.environment(), task).to_json()
    emit(inv.json, report, lambda c: c.print(f"task {task}: ready again", markup=False))


@app.command("cancel")
def cancel(
    ctx: typer.Context, task: Annotated[int, typer.Argument(min=1, help="Task id.")]
) -> None:
    """Cancel a task: stop its running job, close its attempts, remove its workspaces; an
    open PR is left open with a comment."""
    from aiworker.core.tasks.operator import cancel_task

    inv: Invocation = ctx.obj
    report = cancel_task(inv.environment(), task).to_json()
    emit(
        inv.json,
        report,
        lambda c: c.print(
            f"task {task}: cancelled (was {report['was']}); stopped {len(report['stopped'])} "
            f"processes, closed {len(report['attempts_closed'])} attempts",
            markup=False,
        ),
    )
