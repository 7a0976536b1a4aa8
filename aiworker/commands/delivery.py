"""The delivery steps after implementation: `aiworker publish`, `ci`, `review` and `merge`,
and `milestones`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from aiworker.commands.phases import run_unit
from aiworker.invocation import ID_MAX, Invocation
from aiworker.render import emit

Implemented = Annotated[int, typer.Option("--task", min=1, max=ID_MAX, help="An implemented task.")]
Published = Annotated[int, typer.Option("--task", min=1, max=ID_MAX, help="A published task.")]
Checked = Annotated[int, typer.Option("--task", min=1, max=ID_MAX, help="A task whose CI passed.")]
Approved = Annotated[int, typer.Option("--task", min=1, max=ID_MAX, help="An approved task.")]
Plan = Annotated[
    int, typer.Option("--task", min=1, max=ID_MAX, help="A plan awaiting approval or running.")
]


def publish(ctx: typer.Context, task: Implemented) -> int:
    """Push the task's branch and open or update its PR, once, after re-checking
    authorisation, scope, the pinned base and the receipts."""

    def line(report: dict[str, Any]) -> str:
        if report["pr"] is None:
            return f"task {report['task']}: not published; the task is {report['state']}"
        verb = "opened" if report["created"] else "found"
        return (
            f"task {report['task']}: {verb} PR #{report['pr']} from {report['branch']} at "
            f"{report['head']}"
        )

    return run_step(ctx.obj, "publish", task, line)


def ci(ctx: typer.Context, task: Published) -> int:
    """Run ./ci/run at the PR head through the runner core and post `aiworker / ci`."""

    def line(report: dict[str, Any]) -> str:
        return f"task {report['task']}: aiworker / ci {report['state']} at {report['head']}"

    return run_step(ctx.obj, "ci", task, line)


def review(ctx: typer.Context, task: Checked) -> int:
    """Review the PR head independently as the reviewer identity and post a formal review."""

    def line(report: dict[str, Any]) -> str:
        event = report["event"] or "not posted"
        return f"task {report['task']}: review {event} on PR #{report['pr']}"

    return run_step(ctx.obj, "review", task, line)


def merge(ctx: typer.Context, task: Approved) -> int:
    """Merge when the review approved and CI passed on the exact head, and record evidence."""

    def line(report: dict[str, Any]) -> str:
        if report["merge_commit"]:
            return f"task {report['task']}: merged PR #{report['pr']} as {report['merge_commit']}"
        return (
            f"task {report['task']}: PR #{report['pr']} not merged: the issue changed after "
            f"the work was done; the task is {report['state']}"
        )

    return run_step(ctx.obj, "merge", task, line)


def milestones(ctx: typer.Context, task: Plan) -> int:
    """Move a plan forward: read its approval, accept implemented milestones, start the next,
    run the combined checks once all are in."""

    def line(report: dict[str, Any]) -> str:
        started = f"; started milestone task {report['started']}" if report["started"] else ""
        return f"plan {report['task']}: {report['state']} ({report['approval']}){started}"

    return run_step(ctx.obj, "milestones", task, line)


def run_step(
    inv: Invocation, command: str, task: int, line: Callable[[dict[str, Any]], str]
) -> int:
    """Run the step COMMAND for TASK and show its report: the `--json` document, or LINE
    of it; the step's exit code."""
    result = run_unit(inv, command, task)
    report = result.to_json()
    emit(inv.json, report, lambda c: c.print(line(report), markup=False))
    return int(result.exit_code)
