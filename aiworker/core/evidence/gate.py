"""The quality gate: the host re-runs every required check itself on the exact result head.

Requirements come from the issue (requirements.py: a fenced `aiworker-checks`
block of `check_id: ./ci/run ARGS` lines) or default to the repository's `./ci/run`.
Each check runs as a worker job (runner/dispatch.py) on the exact snapshot of the
head, and a receipt binds its outcome to the full head and base hashes and the
scope fingerprint. Publication needs a passing receipt for every check with
exactly those hashes; a check the agent reported as passing that fails here is
a finding.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypedDict, Unpack

from aiworker.contracts.agent import AgentResult
from aiworker.contracts.runner import Delivery, JobResult
from aiworker.contracts.snapshot import Uncheckable
from aiworker.core.evidence.artifacts import (
    JSON,
    TEXT,
    artifact_files,
    record,
    record_received,
    store,
)
from aiworker.core.evidence.authorisation import PHASE
from aiworker.core.evidence.measurements import judge, reported
from aiworker.core.evidence.requirements import Requirement
from aiworker.runtime.git_failures import GitCacheError
from aiworker.runtime.gitcache import GitCache
from aiworker.secrets import redact
from aiworker.store.engine import Database
from aiworker.store.receipts import add_receipt

DEFAULT_TIMEOUT_MS = 30 * 60 * 1000
TAIL_CHARS = 2000


class Dispatch(Protocol):
    """What runs the checks as worker jobs (runner/dispatch.py): the controller's git
    cache, where evidence files are kept and for how long, and the run itself."""

    @property
    def cache(self) -> GitCache: ...
    @property
    def state_dir(self) -> Path: ...
    @property
    def artifact_days(self) -> int: ...

    def run(
        self, index: int, commit: str, argv: Sequence[str], label: str, timeout_ms: int, suite: str
    ) -> Delivery: ...


@dataclass
class GateReport:
    head: str
    base: str
    passed: bool
    checks: list[dict[str, Any]] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    uncheckable: str | None = None  # why no check could run on the head's tree

    def failures(self) -> list[str]:
        """One sentence per check that did not pass (a missed threshold among its findings),
        or why none could run."""
        if self.uncheckable is not None:
            return [self.uncheckable]
        return [
            f"check {c['check_id']} exited {c['exit_code']}"
            if c["exit_code"] != c["expected_exit_code"] or c["status"] == "timed_out"
            else f"check {c['check_id']} missed its measurement thresholds"
            for c in self.checks
            if not c["passed"]
        ]


class CheckExtras(TypedDict, total=False):
    """What run_checks may be given besides its task and requirements."""

    claimed: AgentResult | None
    timeout_ms: int
    phase: str


class CheckOptions(CheckExtras):
    """What run_checks takes besides the snapshot (run_gate passes it on)."""

    task_id: int | None
    scope: str | None
    requirements: list[Requirement]


def run_gate(
    db: Database, jobs: Dispatch, *, index: int, slot: int, **options: Unpack[CheckOptions]
) -> GateReport:
    """Re-run the requirements on the slot's pinned head (after an implementation);
    OPTIONS as run_checks takes them."""
    head = jobs.cache.pinned(index, slot, "head")
    base = jobs.cache.pinned(index, slot, "base")
    if head is None or base is None:
        raise GitCacheError(f"slot {slot} has no pinned base and head to validate")
    return run_checks(db, jobs, index=index, head=head, base=base, **options)


def run_checks(
    db: Database,
    jobs: Dispatch,
    *,
    index: int,
    head: str,
    base: str,
    task_id: int | None,
    scope: str | None,
    requirements: list[Requirement],
    claimed: AgentResult | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    phase: str = PHASE,
) -> GateReport:
    """Run REQUIREMENTS as worker jobs on the snapshot of HEAD; one receipt each."""
    claims = {
        v.check_id: v.exit_code == v.expected_exit_code
        for v in (claimed.validation if claimed else [])
    }
    report = GateReport(head, base, passed=True)
    for requirement in requirements:
        ran: dict[str, Any] = {}
        try:
            result = _run(jobs, index, head, requirement, timeout_ms, ran)
        except Uncheckable as exc:
            report.uncheckable = f"the work at {head[:12]} cannot be checked: {exc}"
            report.findings.append(report.uncheckable)
            report.passed = False
            return report
        passed = result.status != "timed_out" and result.exit_code == requirement.expected_exit_code
        body = {
            "command": list(requirement.argv),
            "status": result.status,
            "exit_code": result.exit_code,
            "expected_exit_code": requirement.expected_exit_code,
            "duration_ms": result.duration_ms,
            "stdout_sha256": result.evidence.stdout.sha256,
            "stderr_sha256": result.evidence.stderr.sha256,
            # The streams' (masked) tails, for a repair to read what failed.
            "stdout_tail": _tail(result.evidence.stdout.tail_base64),
            "stderr_tail": _tail(result.evidence.stderr.tail_base64),
            "agent_claimed_pass": claims.get(requirement.check_id),
            **ran,
        }
        if claims.get(requirement.check_id) and not passed:
            finding = (
                f"check {requirement.check_id} was reported passing by the agent "
                f"but exited {result.exit_code} on re-run at {head}"
            )
            report.findings.append(finding)
            body["finding"] = finding
        if requirement.thresholds:
            try:
                missed = _measure(jobs, index, base, requirement, result, body, timeout_ms)
            except Uncheckable as exc:  # the base, measured for a relative bound
                missed = [f"check {requirement.check_id}: the base at {base[:12]} cannot be "
                          f"measured: {exc}"]  # fmt: skip
            report.findings += missed
            passed = passed and not missed
        # The payloads first: a failed write (a full disk) records no receipt at all.
        files = artifact_files(jobs.state_dir)
        kept = [
            store(files, f"{stream}.tail", _tail(evidence.tail_base64, None).encode(), TEXT)
            for stream, evidence in (
                ("stdout", result.evidence.stdout),
                ("stderr", result.evidence.stderr),
            )
        ]
        body["artifacts"] = {s.name: s.sha256 for s in kept}
        # The streams' logs the runner sent to the store (their first bytes, masked).
        body["artifacts"].update({ref.name: ref.sha256 for ref in result.artifacts})
        kept.append(store(files, "receipt.json", json.dumps(body, indent=2).encode(), JSON))
        job = body["worker_job"]
        job_name = f"{job['repository_index']}/{job['worker_job_index']}"
        with db.write() as session:
            receipt = add_receipt(
                session,
                task_id=task_id,
                phase=phase,
                head=head,
                base=base,
                scope=scope,
                check_id=requirement.check_id,
                outcome="pass" if passed else "fail",
                body=body,
            )
            refers: dict[str, Any] = {
                "task_id": task_id,
                "receipt_id": receipt,
                "worker_job": job_name,
            }
            for stored in kept:
                record(session, stored, jobs.artifact_days, **refers)
            for ref in result.artifacts:
                record_received(session, files, ref, jobs.artifact_days, **refers)
        report.checks.append(
            {
                "check_id": requirement.check_id,
                "passed": passed,
                "receipt": receipt,
                "receipt_sha256": kept[-1].sha256,
                **body,
            }
        )
        report.passed = report.passed and passed
    return report


def _run(
    jobs: Dispatch,
    index: int,
    commit: str,
    requirement: Requirement,
    timeout_ms: int,
    body: dict[str, Any] | None = None,
) -> JobResult:
    """Run REQUIREMENT on COMMIT as a worker job; BODY (the receipt's) records which."""
    label = f"gate {requirement.check_id}"
    delivery = jobs.run(index, commit, requirement.argv, label, timeout_ms, requirement.check_id)
    if body is not None:
        body["worker_job"] = {
            "repository_index": delivery.repository_index,
            "worker_job_index": delivery.worker_job_index,
            "attempt": delivery.attempt,
            "worker_id": delivery.worker_id,
        }
    assert delivery.result is not None
    return delivery.result


def _measure(
    jobs: Dispatch,
    index: int,
    base: str,
    requirement: Requirement,
    result: JobResult,
    body: dict[str, Any],
    timeout_ms: int,
) -> list[str]:
    """Judge REQUIREMENT's thresholds on the head's measurements and, where a bound is
    relative, the base's (the same check run at the base by the host); recorded in BODY.
    Returns why the check fails because of them."""
    head = reported(_tail(result.evidence.stdout.tail_base64, limit=None))
    baseline = None
    if any(t.relative for t in requirement.thresholds):
        ran = _run(jobs, index, base, requirement, timeout_ms)
        baseline = reported(_tail(ran.evidence.stdout.tail_base64, limit=None))
    outcomes, failures = judge(requirement.thresholds, head, baseline)
    body["measurements"] = {"head": head, "baseline": baseline}
    body["thresholds"] = outcomes
    return [f"check {requirement.check_id}: {failure}" for failure in failures]


def _tail(encoded: str, limit: int | None = TAIL_CHARS) -> str:
    text = redact(base64.b64decode(encoded).decode(errors="replace"))
    return text if limit is None else text[-limit:]
