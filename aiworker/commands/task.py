"""`aiworker task`: list, show, retry and cancel tasks."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from aiworker.invocation import ID_MAX, Invocation
from aiworker.render import emit

app = typer.Typer(help="Inspect and steer tasks.", no_args_is_help=True, rich_markup_mode=None)


@app.command("list")
def list_(
    ctx: typer.Context,
    state: Annotated[str | None, typer.Option("--state", help="Only tasks in this state.")] = None,
    after: Annotated[
        int, typer.Option("--after", min=0, max=ID_MAX, help="Only tasks with a larger id.")
    ] = 0,
) -> None:
    """Tasks by id with their kind, issue and state (500 per page; --after continues)."""
    from aiworker.core.tasks.inspect import list_task_rows

    inv: Invocation = ctx.obj
    report = list_task_rows(inv.environment(), state, after=after).to_json()

    def human(console: Any) -> None:
        from aiworker.views import task_list

        for part in task_list(report):
            console.print(part, markup=False)

    emit(inv.json, report, human)


@app.command("show")
def show(
    ctx: typer.Context, task: Annotated[int, typer.Argument(min=1, max=ID_MAX, help="Task id.")]
) -> None:
    """One task: state, its history of events, attempts, budgets, receipts, publication,
    and where its files are."""
    from aiworker.core.tasks.inspect import show_task

    inv: Invocation = ctx.obj
    report = show_task(inv.environment(), task).to_json()

    def human(console: Any) -> None:
        from aiworker.views import task_show

        console.print("\n".join(task_show(report)), markup=False)

    emit(inv.json, report, human)


@app.command("retry")
def retry(
    ctx: typer.Context,
    task: Annotated[int, typer.Argument(min=1, max=ID_MAX, help="Task id.")],
    from_start: Annotated[
        bool, typer.Option("--from-start", help="Back to ready, its work made anew.")
    ] = False,
) -> None:
    """Retry a failed or needs_input task, resetting its budgets (recorded): a step past
    implementation whose own budget ran out where it failed, its work kept; else from
    ready."""
    from aiworker.core.tasks.retry import retry_task

    inv: Invocation = ctx.obj
    report = retry_task(inv.environment(), task, from_start=from_start)
    state = report.state
    emit(inv.json, report.to_json(), lambda c: c.print(f"task {task}: {state}", markup=False))


@app.command("resume")
def resume(
    ctx: typer.Context, task: Annotated[int, typer.Argument(min=1, max=ID_MAX, help="Task id.")]
) -> None:
    """Take a paused task back (one a restore held, or any other): to the state it was
    paused in where each step re-verifies its evidence, else to ready."""
    from aiworker.core.tasks.hold import resume_task

    inv: Invocation = ctx.obj
    report = resume_task(inv.environment(), task).to_json()
    line = f"task {report['task']}: {report['was']} -> {report['state']}"
    emit(inv.json, report, lambda c: c.print(line, markup=False))


@app.command("cancel")
def cancel(
    ctx: typer.Context, task: Annotated[int, typer.Argument(min=1, max=ID_MAX, help="Task id.")]
) -> None:
    """Cancel a task: stop its running job, close its attempts, remove its workspaces; an
    open PR is left open with a comment."""
    from aiworker.core.tasks.operator import cancel_task

    inv: Invocation = ctx.obj
    report = cancel_task(inv.environment(), task).to_json()
    line = (
        f"task {task}: cancelled (was {report['was']}); stopped {len(report['stopped'])} "
        f"processes, closed {len(report['attempts_closed'])} attempts"
    )
    if report["pr_merged"]:
        line += f"; PR #{report['pr_merged']} had merged before the cancel took effect"
    emit(inv.json, report, lambda c: c.print(line, markup=False))
