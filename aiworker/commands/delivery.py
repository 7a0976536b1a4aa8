"""The delivery steps after implementation: `aiworker publish`, `ci`, `review` and `merge`,
and `milestones`."""

from __future__ import annotations

from typing import Annotated

import typer

from aiworker.commands.phases import run_unit
from aiworker.invocation import Invocation
from aiworker.render import emit


def publish(
    ctx: typer.Context,
    task: Annotated[int, typer.Option("--task", min=1, help="An implemented task.")],
) -> None:
    """Push the task's branch and open or update its PR, once, after re-checking
    authorisation, scope, the pinned base and the receipts."""
    inv: Invocation = ctx.obj
    result = run_unit(inv, "publish", task)
    report = result.to_json()
    verb = "opened" if report["created"] else "found"
    emit(
        inv.json,
        report,
        lambda c: c.print(
            f"task {report['task']}: {verb} PR #{report['pr']} from {report['branch']} at "
            f"{report['head']}"
            if report["pr"] is not None
            else f"task {report['task']}: not published; the task is {report['state']}",
            markup=False,
        ),
    )


def ci(
    ctx: typer.Context,
    task: Annotated[int, typer.Option("--task", min=1, help="A published task.")],
) -> int:
    """Run ./ci/run at the PR head through the runner core and post `aiworker / ci`."""
    inv: Invocation = ctx.obj
    result = run_unit(inv, "ci", task)
    report = result.to_json()
    emit(
        inv.json,
        report,
        lambda c: c.print(
            f"task {report['task']}: aiworker / ci {report['state']} at {report['head']}",
            markup=False,
        ),
    )
    return int(result.exit_code)


def review(
    ctx: typer.Context,
    task: Annotated[int, typer.Option("--task", min=1, help="A task whose CI passed.")],
) -> int:
    """Review the PR head independently as the reviewer identity and post a formal review."""
    inv: Invocation = ctx.obj
    result = run_unit(inv, "review", task)
    report = result.to_json()
    emit(
        inv.json,
        report,
        lambda c: c.print(
            f"task {report['task']}: review {report['event'] or 'not posted'} "
            f"on PR #{report['pr']}",
            markup=False,
        ),
    )
    return int(result.exit_code)


def merge(
    ctx: typer.Context,
    task: Annotated[int, typer.Option("--task", min=1, help="An approved task.")],
) -> None:
    """Merge when the review approved and CI passed on the exact head, and record evidence."""
    inv: Invocation = ctx.obj
    result = run_unit(inv, "merge", task)
    report = result.to_json()
    emit(
        inv.json,
        report,
        lambda c: c.print(
            f"task {report['task']}: merged PR #{report['pr']} as {report['merge_commit']}"
            if report["merge_commit"]
            else f"task {report['task']}: PR #{report['pr']} not merged: the issue changed "
            f"after the work was done; the task is {report['state']}",
            markup=False,
        ),
    )


def milestones(
    ctx: typer.Context,
    task: Annotated[
        int, typer.Option("--task", min=1, help="A plan awaiting approval or running.")
    ],
) -> None:
    """Move a plan forward: read its approval, accept implemented milestones, start the next,
    run the combined checks once all are in."""
    inv: Invocation = ctx.obj
    report = run_unit(inv, "milestones", task).to_json()
    started = f"; started milestone task {report['started']}" if report["started"] else ""
    emit(
        inv.json,
        report,
        lambda c: c.print(
            f"plan {report['task']}: {report['state']} ({report['approval']}){started}",
            markup=False,
        ),
    )
