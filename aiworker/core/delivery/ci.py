"""`aiworker ci --task ID`: run the repository's ./ci/run at the PR head and report it.

The controller posts `pending`, runs the check through the runner core on a
fresh checkout of the exact head, writes a receipt, and posts the terminal
status under the context `aiworker / ci`, linking the receipt's page under
`web.public_url` (no link without one). Statuses are posted by the `ci` identity
where one is configured, else by the worker. A red run starts a repair episode with
its evidence (tasks/repairs.py) instead of ending the task. Every `pending` is followed by a
terminal status: a failure of the run's setup posts `error` with the reason
(the guard does it), and a run whose process died gets its `error` from
recovery (tasks/recovery.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiworker.contracts.agent import Finding
from aiworker.core.context import Environment
from aiworker.core.delivery.pull import CI_CONTEXT, Delivery, load_delivery, move, pull_at_head
from aiworker.core.delivery.steps import step_guard
from aiworker.core.evidence.artifacts import artifact_files
from aiworker.core.evidence.gate import run_checks
from aiworker.core.evidence.receipts import receipt_url
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.intake.scope import Requirement
from aiworker.core.report import Report
from aiworker.core.runner.dispatch import Dispatch
from aiworker.core.scheduling.launcher import follow_up_if_asked
from aiworker.core.tasks.repairs import RepairRequest, request_repair
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import EXIT_FAILED, EXIT_OK
from aiworker.runtime.failpoints import failpoint
from aiworker.runtime.gitcache import GitCache


@dataclass
class CiReport(Report):
    task: int
    pr: int
    head: str
    state: str  # success | failure
    check: dict[str, Any]
    evidence: str  # the receipt's body in the artifact store
    receipt: int
    receipt_url: str  # empty without web.public_url

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.state == "success" else EXIT_FAILED


def post_ci_error(env: Environment, delivery: Delivery, head: str, reason: str) -> None:
    """The terminal `error` status that follows a `pending` whose run could not finish."""
    poster = ForgeAccess(env.loaded).status_writer()
    poster.create_status(
        delivery.repo.owner,
        delivery.repo.name,
        head,
        state="error",
        context=CI_CONTEXT,
        description=f"aiworker could not finish ./ci/run: {reason}"[:140],
    )


def ci_finding(check: dict[str, Any], head: str) -> Finding:
    """A red CI as a finding a repair can act on: what ran, how it ended, the digests and
    the (masked) tails of its output."""
    return Finding(
        severity="blocker",
        message=(
            f"{' '.join(check['command'])} {check['status']} with exit {check['exit_code']} "
            f"at {head}; stdout sha256 {check['stdout_sha256']}, stderr sha256 "
            f"{check['stderr_sha256']}\n--- stdout tail ---\n{check.get('stdout_tail', '')}"
            f"\n--- stderr tail ---\n{check.get('stderr_tail', '')}"
        ),
    )


def dispatch_ci(env: Environment, task_id: int) -> CiReport:
    db = env.open_database()
    try:
        delivery = load_delivery(db, task_id, S.AWAITING_CI)
        task, repo = delivery.task, delivery.repo
        head, base = task.head_commit, task.base_commit
        assert head is not None
        assert base is not None
        pending = False

        def terminal_error(reason: str) -> None:
            if pending:
                post_ci_error(env, delivery, head, reason)

        with step_guard(env, db, task, "ci", {"head": head}, terminal_error) as guard:
            access = ForgeAccess(env.loaded)
            worker = access.required("worker")
            pull_at_head(worker, delivery)
            clone_url = worker.repository(repo.owner, repo.name).clone_url
            GitCache(env.state_dir).ensure(
                repo.index, clone_url, access.token("worker"), head, base
            )
            poster = access.status_writer()
            poster.create_status(
                repo.owner,
                repo.name,
                head,
                state="pending",
                context=CI_CONTEXT,
                description="./ci/run is running",
            )
            pending = True
            failpoint("ci.after_pending")
            report = run_checks(
                db,
                Dispatch.of(env, db),
                index=repo.index,
                head=head,
                base=base,
                task_id=task.id,
                scope=task.scope_fingerprint,
                requirements=[Requirement("ci", ("./ci/run",))],
                phase="ci",
            )
            check = report.checks[0]
            state = "success" if report.passed else "failure"
            # The receipt's body, as kept in the artifact store: for the operator on this
            # host (the status links the receipt's page, never a file).
            evidence = artifact_files(env.state_dir).path(check["receipt_sha256"])
            link = receipt_url(env.loaded.config, check["receipt"])
            failpoint("ci.after_checks")
            description = (
                f"./ci/run {check['status']} (exit {check['exit_code']}) at "
                f"{head[:12]}; stdout sha256 {check['stdout_sha256'][:16]}"
            )
            poster.create_status(
                repo.owner,
                repo.name,
                head,
                state=state,
                context=CI_CONTEXT,
                description=description[:140],
                target_url=link,
            )
            pending = False
            guard.finish("succeeded" if report.passed else "failed", f"./ci/run {state}")
            if report.passed:
                move(
                    db,
                    task,
                    S.AWAITING_CI,
                    S.AWAITING_REVIEW,
                    "ci.finished",
                    {"state": state, "head": head, "pr": delivery.pr},
                    f"./ci/run {check['status']} at {head[:12]}",
                )
            else:
                request = RepairRequest("ci", head, base, [ci_finding(check, head)])
                why = f"./ci/run {check['status']} (exit {check['exit_code']}) at {head[:12]}"
                request_repair(env, db, task, S.AWAITING_CI, request, why)
        follow_up_if_asked(env)
        return CiReport(
            task.id, delivery.pr, head, state, check, str(evidence), check["receipt"], link
        )
    finally:
        db.dispose()
