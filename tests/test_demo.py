"""`make demo`'s script runs end to end from a fresh directory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_demo_runs_end_to_end(tmp_path, engine, request):
    env = dict(os.environ)
    if engine == "postgresql":  # the same demo, its store a PostgreSQL database
        env["AIWORKER_DEMO_DATABASE_URL"] = request.getfixturevalue("postgres_url")
    done = subprocess.run(
        [sys.executable, "-m", "aiworker.demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,  # 4-5 minutes on a loaded 2-core machine
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "polled 1 repositories (1 full); tasks: created 1" in done.stdout
    assert "polled 1 repositories (1 incremental); tasks: unchanged 1" in done.stdout
    assert "task 1: implemented with script" in done.stdout
    assert "ci: pass at" in done.stdout
    assert "merged=True" in done.stdout
    assert "status aiworker / ci: success" in done.stdout
    assert "review by reviewer-bot: APPROVED" in done.stdout
    backup = "backup.dump" if engine == "postgresql" else "backup.db"
    assert (tmp_path / ".demo" / backup).exists()
    # The second scenario: a plan through approval, two milestones, a repair, one merge.
    out = done.stdout
    assert "awaiting_plan_approval (ignored: commented /aiworker approve by reader (read))" in out
    assert "plan approved: labelled aiworker-approved by alice (write)" in out
    assert "task 4 (milestone): implemented -> done  accepted into plan 2" in out
    first_done = out.index("task 3 (milestone): implemented -> done")
    assert first_done < out.index("task 4 (milestone): new -> ready")
    assert "task 2 (plan): awaiting_review -> repairing  review" in out
    assert "task 2 (plan): approved -> done  merged as" in out
    assert "PR #4 'Please add subtraction': merged=True" in out
    assert out.count("review by reviewer-bot: REQUEST_CHANGES") == 1
