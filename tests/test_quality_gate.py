"""The quality gate re-runs the checks itself on the exact head and binds receipts to hashes."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta

import pytest

from aiworker.config.models import Runners
from aiworker.contracts.agent import AgentResult
from aiworker.core.evidence.authorisation import publication_allowed
from aiworker.core.evidence.gate import run_gate
from aiworker.core.evidence.requirements import Requirement, requirements_from_issue
from aiworker.core.runner.dispatch import Dispatch
from aiworker.core.runner.snapshots import published
from aiworker.errors import InvalidInput
from aiworker.runtime.gitcache import GitCache
from aiworker.sandbox.gitrepo import BareRepo
from aiworker.sandbox.seed import PROJECT, create_project
from aiworker.store import worker_job_records, worker_jobs
from aiworker.store.engine import Database
from tests.forge_fixtures import git

SCOPE = "f" * 64


def jobs(db, cache):
    """Checks as worker jobs run by the embedded runner, as with no fleet configured."""
    return Dispatch(db, cache, cache.root.parent, Runners(), {})


def gate_slot_1(db, cache, requirements, **more):
    """The gate on slot 1's pinned head of repository 1, with no task."""
    return run_gate(
        db,
        jobs(db, cache),
        index=1,
        slot=1,
        task_id=None,
        scope=SCOPE,
        requirements=requirements,
        **more,
    )


@pytest.fixture
def setup(upgraded, state_dir, tmp_path):
    origin = tmp_path / "origin.git"
    create_project(BareRepo(origin), PROJECT)
    cache = GitCache(state_dir)
    cache.fetch(1, str(origin), None)
    cache.pin(1, 1, "base", "refs/remotes/origin/main")
    return Database(f"sqlite:///{upgraded}"), cache


def result_head(cache, tmp_path, content):
    work = tmp_path / "ws"
    bundle = cache.bundle_out(1, 1, tmp_path / "base.bundle")
    git("init", "-q", str(work))
    git("fetch", "-q", str(bundle), "refs/aiworker/slot-1/base:refs/heads/base", cwd=work)
    git("checkout", "-q", "-b", "work", "base", cwd=work)
    (work / "calc.py").write_text(content)
    git("commit", "-qam", "agent change", cwd=work)
    out = tmp_path / "result.bundle"
    git("bundle", "create", "-q", str(out), "base..work", cwd=work)
    return cache.import_result(1, 1, out, "refs/heads/work")


def claim(check_id="ci", exit_code=0):
    return AgentResult.model_validate(
        {
            "contract": "ait.agent.result.v1",
            "completion": "complete",
            "summary": "fixed",
            "validation": [{"check_id": check_id, "command": ["./ci/run"], "exit_code": exit_code}],
        }
    )


def test_passing_head_gets_receipts_that_authorise_only_that_head(setup, tmp_path):
    db, cache = setup
    head = result_head(cache, tmp_path, "def add(a, b):\n    return a + b\n")
    base = cache.pinned(1, 1, "base")
    requirements = requirements_from_issue("no checks block here")
    report = gate_slot_1(db, cache, requirements, claimed=claim())
    assert report.passed, report.checks
    assert (report.head, report.base) == (head, base)
    assert report.findings == []
    allowed, reason = publication_allowed(
        db, None, head=head, base=base, scope=SCOPE, requirements=requirements
    )
    assert allowed, reason
    stale, why = publication_allowed(
        db, None, head="0" * 40, base=base, scope=SCOPE, requirements=requirements
    )
    assert not stale
    assert "missing or stale" in why
    moved_base, _ = publication_allowed(
        db, None, head=head, base="1" * 40, scope=SCOPE, requirements=requirements
    )
    assert not moved_base
    rescoped, _ = publication_allowed(
        db, None, head=head, base=base, scope="e" * 64, requirements=requirements
    )
    assert not rescoped
    db.dispose()


def test_a_claimed_pass_that_fails_on_rerun_is_a_finding(setup, tmp_path):
    db, cache = setup
    head = result_head(cache, tmp_path, "def add(a, b):\n    return a * b\n")
    requirements = [Requirement("ci", ("./ci/run",))]
    report = gate_slot_1(db, cache, requirements, claimed=claim())
    assert not report.passed
    assert report.findings == [
        f"check ci was reported passing by the agent but exited 1 on re-run at {head}"
    ]
    allowed, reason = publication_allowed(
        db, None, head=head, base=cache.pinned(1, 1, "base"), scope=SCOPE, requirements=requirements
    )
    assert not allowed
    assert "failed" in reason
    db.dispose()


def test_requirements_from_the_issue():
    body = (
        "Fix it.\n\n```aiworker-checks\n# the unit suite\nunit: ./ci/run --suite unit\n"
        "lint: ./ci/run lint\n```\n"
    )
    assert requirements_from_issue(body) == [
        Requirement("unit", ("./ci/run", "--suite", "unit")),
        Requirement("lint", ("./ci/run", "lint")),
    ]
    assert requirements_from_issue("") == [Requirement("ci", ("./ci/run",))]
    for bad in (
        "```aiworker-checks\nunit: make test\n```",
        "```aiworker-checks\nno colon\n```",
        "```aiworker-checks\na: ./ci/run\na: ./ci/run x\n```",
    ):
        with pytest.raises(InvalidInput):
            requirements_from_issue(bad)


MEASURED_RUN = (
    '#!/bin/sh\nset -eu\ncd "$(dirname "$0")/.."\n'
    'echo "aiworker-measurement speed_ms $(cat speed.txt)"\npython3 -m unittest -v\n'
)


@pytest.fixture
def measured(upgraded, state_dir, tmp_path):
    """A project whose ./ci/run reports speed_ms from speed.txt (100 at the base)."""
    origin = tmp_path / "measured.git"
    create_project(
        BareRepo(origin),
        {**PROJECT, "calc.py": "def add(a, b):\n    return a + b\n", "ci/run.sh": MEASURED_RUN}
        | {"speed.txt": "100\n"},
    )
    cache = GitCache(state_dir)
    cache.fetch(1, str(origin), None)
    base = cache.pin(1, 1, "base", "refs/remotes/origin/main")

    def gate(speed, *thresholds):
        work = tmp_path / f"ws-{speed}-{len(thresholds)}"
        bundle = cache.bundle_out(1, 1, tmp_path / "m.bundle")
        git("init", "-q", str(work))
        git("fetch", "-q", str(bundle), "refs/aiworker/slot-1/base:refs/heads/base", cwd=work)
        git("checkout", "-q", "-b", "work", "base", cwd=work)
        if speed is None:
            (work / "ci" / "run.sh").write_text(PROJECT["ci/run.sh"])
        else:
            (work / "speed.txt").write_text(f"{speed}\n")
        git("commit", "-qam", "agent change", cwd=work)
        out = tmp_path / f"r-{speed}.bundle"
        git("bundle", "create", "-q", str(out), "base..work", cwd=work)
        cache.import_result(1, 1, out, "refs/heads/work")
        block = "\n".join(["perf: ./ci/run", *thresholds])
        requirements = requirements_from_issue(f"```aiworker-checks\n{block}\n```\n")
        db = Database(f"sqlite:///{upgraded}")
        try:
            report = gate_slot_1(db, cache, requirements)
        finally:
            db.dispose()
        return report, base

    return gate


def test_thresholds_are_declared_on_a_check_of_the_block():
    [perf] = requirements_from_issue(
        "```aiworker-checks\nperf: ./ci/run bench\n"
        "perf measures startup_ms <= 1.10x baseline (passing)\n"
        "perf measures rss_mb >= 2 (advisory)\n```"
    )
    assert [t.text() for t in perf.thresholds] == [
        "startup_ms <= 1.1x baseline (passing)",
        "rss_mb >= 2 (advisory)",
    ]
    with pytest.raises(InvalidInput, match="line 1: no check 'perf' declared above"):
        requirements_from_issue("```aiworker-checks\nperf measures x <= 1 (passing)\n```")


def test_a_relative_threshold_compares_the_head_with_the_base_measured_by_the_host(measured):
    report, base = measured(105, "perf measures speed_ms <= 1.10x baseline (passing)")
    assert report.passed, report
    assert report.base == base  # the baseline is measured at the pinned base
    [check] = report.checks
    assert check["measurements"] == {"head": {"speed_ms": 105.0}, "baseline": {"speed_ms": 100.0}}
    [outcome] = check["thresholds"]
    assert (outcome["outcome"], outcome["bound"]) == ("met", pytest.approx(110.0))


def test_a_missed_passing_threshold_fails_the_check(measured):
    report, _ = measured(130, "perf measures speed_ms <= 1.10x baseline (passing)")
    assert not report.passed
    assert report.checks[0]["exit_code"] == 0  # the command itself passed
    assert report.findings == [
        "check perf: threshold missed: speed_ms is 130, not <= 110 "
        "(speed_ms <= 1.1x baseline (passing))"
    ]


def test_an_advisory_threshold_is_recorded_but_needs_complete_measurements(measured):
    missed, _ = measured(130, "perf measures speed_ms <= 120 (advisory)")
    assert missed.passed
    assert missed.checks[0]["thresholds"][0]["outcome"] == "missed"
    unreported, _ = measured(None, "perf measures speed_ms <= 120 (advisory)")
    assert not unreported.passed
    assert unreported.findings == ["check perf: measurement speed_ms was not reported at the head"]


def test_checks_are_worker_jobs_and_a_job_left_by_a_dead_controller_is_ended(setup, tmp_path):
    db, cache = setup
    # A check whose controller process died mid-job: its embedded runner's lease ran out.
    # Another's lease ran out by the clock too, but its process still runs aiworker (the
    # wall clock was set forward): it is left to finish.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = worker_jobs.enqueue(db, 1, {"label": "old", "source": {"snapshot_id": "0" * 40}})
    live = worker_jobs.enqueue(db, 1, {"label": "live", "source": {"snapshot_id": "0" * 40}})
    holder = subprocess.Popen([sys.executable, "-m", "aiworker", "sandbox", "serve", "--data",
                               str(tmp_path / "idle-forge"), "--port", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    short = timedelta(milliseconds=50)
    for worker, job in (
        (f"embedded-{dead.stdout.strip()}", stale),
        (f"embedded-{holder.pid}", live),
    ):
        lease = worker_jobs.claim(
            db, worker, worker, lease_for=short, max_attempts=3, exact=(1, job)
        )
        assert lease is not None
    time.sleep(0.1)
    head = result_head(cache, tmp_path, "def add(a, b):\n    return a + b\n")
    try:
        report = gate_slot_1(db, cache, requirements_from_issue("no checks block"))
    finally:
        holder.kill()
        holder.wait()
    assert report.passed
    ended = worker_job_records.get_job(db, (1, stale))
    assert ended.state == "failed"
    assert "controller process died" in ended.result["error"]
    assert worker_job_records.get_job(db, (1, live)).state == "leased"
    # The check ran as worker job 3, on the snapshot of the head, and was delivered.
    check = worker_job_records.get_job(db, (1, 3))
    assert check.request["source"]["kind"] == "remote_snapshot"
    assert check.result["contract"] == "ait.runner.delivery.v1"
    assert (
        check.result["result"]["evidence"]["stdout"]["sha256"] == report.checks[0]["stdout_sha256"]
    )
    assert head
    assert report.checks[0]["worker_job"] == {
        "repository_index": 1,
        "worker_job_index": 3,
        "attempt": 1,
        "worker_id": check.result["worker_id"],
    }
    assert check.result["worker_id"].startswith("embedded-")
    # No snapshot outlives the jobs that named it.
    assert published(cache.root.parent, 1) == set()
