"""`aiworker ci --task ID`: run the repository's ./ci/run at the PR head and report it.

The controller posts `pending`, runs the check through the runner core on a
fresh checkout of the exact head, writes a receipt, and posts the terminal
status under the context `aiworker / ci`, linking the receipt's page under
`web.public_url` (no link without one). Statuses are posted by the `ci` identity
where one is configured, else by the worker. A red run starts a repair episode with
its evidence (tasks/repairs.py) instead of ending the task. Every `pending` is followed by a
terminal status: a failure of the run's setup posts `error` with the reason
(the driver runs the hook the step left), and a run whose process died gets its `error`
from recovery (the table names `abandoned` for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiworker.contracts.agent import Finding
from aiworker.core.context import Environment
from aiworker.core.evidence.artifacts import artifact_files
from aiworker.core.evidence.ci_status import CI_CONTEXT
from aiworker.core.evidence.receipts import receipt_url
from aiworker.core.evidence.requirements import default_requirements
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.phases.at_head import gate_at, pull_at_head
from aiworker.core.phases.job import Job
from aiworker.core.phases.merged import merged
from aiworker.core.phases.outcome import Outcome
from aiworker.core.report import Report
from aiworker.core.tasks.repairs import RepairRequest
from aiworker.core.tasks.states import TaskState as S
from aiworker.errors import EXIT_FAILED, EXIT_OK, AiworkerError
from aiworker.runtime.failpoints import failpoint
from aiworker.runtime.gitcache import GitCache
from aiworker.store.engine import Database
from aiworker.store.models import Repository, Task
from aiworker.store.tasks import append_event


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

    def landed(self, state: str, refusal: str | None) -> None:
        """Its state is the run's, not the task's."""


def post_ci_error(env: Environment, repo: Repository, head: str, reason: str) -> None:
    """The terminal `error` status that follows a `pending` whose run could not finish."""
    poster = ForgeAccess(env.loaded).status_writer()
    poster.create_status(
        repo.owner,
        repo.name,
        head,
        state="error",
        context=CI_CONTEXT,
        description=env.for_the_forge(f"aiworker could not finish ./ci/run: {reason}")[:140],
    )


def abandoned(env: Environment, db: Database, task_id: int, head: str, reason: str) -> None:
    """A CI run whose process died: its `pending` gets the terminal `error` (recovery)."""
    with db.read() as session:
        task = session.get(Task, task_id)
        repo = session.get(Repository, task.repository_id) if task else None
    try:
        if repo is None:
            raise AiworkerError(f"task {task_id} is gone")
        post_ci_error(env, repo, head, reason)
    except AiworkerError as exc:
        with db.write() as session:
            append_event(session, "ci.status_failed", task_id=task_id, data={"reason": exc.message})


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


def ci(job: Job) -> Outcome:
    env, task, repo = job.env, job.task, job.repo
    head, base = task.head_commit, task.base_commit
    assert head is not None
    assert base is not None
    assert job.pr is not None
    job.start(None, {"head": head})
    access = ForgeAccess(env.loaded)
    worker = access.required("worker")
    pull = pull_at_head(job, worker)
    if pull.merged:  # by a person: nothing is checked for it any more
        return merged(job, pull, worker, ours=False)
    clone_url = worker.repository(repo.owner, repo.name).clone_url
    GitCache(env.state_dir).ensure(repo.index, clone_url, access.token("worker"), head, base)
    poster = access.status_writer()
    poster.create_status(
        repo.owner,
        repo.name,
        head,
        state="pending",
        context=CI_CONTEXT,
        description="./ci/run is running",
    )
    # From here every failure posts the terminal `error` that follows this `pending`.
    job.failure_hook = lambda reason: post_ci_error(env, repo, head, reason)
    failpoint("ci.after_pending")
    checked = gate_at(job, head, base, default_requirements(), phase=job.phase.name)
    check = checked.checks[0]
    state = "success" if checked.passed else "failure"
    # The receipt's body, as kept in the artifact store: for the operator on this host
    # (the status links the receipt's page, never a file).
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
    job.failure_hook = None
    report = CiReport(task.id, job.pr, head, state, check, str(evidence), check["receipt"], link)
    why = f"./ci/run {check['status']} (exit {check['exit_code']}) at {head[:12]}"
    if checked.passed:
        data = {"state": state, "head": head, "pr": job.pr}
        passed = f"./ci/run {check['status']} at {head[:12]}"
        landing = Outcome(report, S.AWAITING_REVIEW, passed, kind="ci.finished", data=data)
        return landing.ended("succeeded", f"./ci/run {state}")
    request = RepairRequest("ci", head, base, [ci_finding(check, head)])
    return Outcome(report, repair=request, reason=why).ended("failed", f"./ci/run {state}")
