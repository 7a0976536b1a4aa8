"""Repositories of shapes the sandbox's small project lacks. What a runner cannot check
out of the base (a submodule, a name that is not UTF-8) or cannot run (`ci/run.sh`
beside `ci/run` but not executable), and a repository without commits, stop a task in
needs_input before any inference, saying what to change; a link whose target is not
UTF-8 is checked like any other."""

from __future__ import annotations

import os

from tests.forge_fixtures import git
from tests.helpers import run_process
from tests.test_delivery import REVIEW_OK, deliver_until
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc
from tests.test_people_on_the_forge import _held

CHECKS = '#!/bin/sh\nset -eu\ncd "$(dirname "$0")/.."\npython3 -m unittest -v\n'


def _reshape(forge, tmp_path, build) -> None:
    """Commit what BUILD makes of a clone of team/app to its main, as a person would."""
    work = tmp_path / "reshape"
    git("clone", "-q", forge.clone_url("alice"), str(work))
    build(work)
    git("add", "-A", cwd=work)
    git("commit", "-qm", "Reshape", cwd=work)
    git("push", "-q", "origin", "HEAD:main", cwd=work)


def _add_submodule(tmp_path, work) -> None:
    """A repository of its own, added to WORK as the submodule vendor/lib."""
    library = tmp_path / "library"
    library.mkdir()
    git("init", "-q", "-b", "main", cwd=library)
    (library / "helper.py").write_text("X = 1\n")
    git("add", "-A", cwd=library)
    git("commit", "-qm", "Library", cwd=library)
    allow = ("-c", "protocol.file.allow=always")
    git(*allow, "submodule", "add", "-q", str(library), "vendor/lib", cwd=work)


def _implemented(claimed):
    task = claimed(
        SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc(), phases={"review": REVIEW_OK}
    )
    return task, run_process("--json", "implement", "--task", str(task), "--slot", "1")


def _needs_input(upgraded, implemented, problem: str) -> None:
    assert implemented.exit_code == 1, implemented
    report = implemented.json()
    assert report["outcome"] == "needs_input", report
    assert problem in report["reason"], report["reason"]
    assert query(upgraded, "select state from tasks") == [("needs_input",)]
    assert query(upgraded, "select count(*) from attempts where provider is not null") == [(0,)]


def test_a_base_with_a_submodule_asks_for_input_before_any_inference(
    forge, claimed, upgraded, tmp_path
):
    _reshape(forge, tmp_path, lambda work: _add_submodule(tmp_path, work))
    # Before, the model ran and its work failed as "cannot be checked", and the task failed.
    _, implemented = _implemented(claimed)
    _needs_input(upgraded, implemented, "holds submodules (vendor/lib)")


def test_a_submodule_added_to_the_base_after_the_work_holds_the_task(
    forge, claimed, upgraded, tmp_path
):
    task, implemented = _implemented(claimed)
    assert implemented.exit_code == 0, implemented
    _reshape(forge, tmp_path, lambda work: _add_submodule(tmp_path, work))
    # Before, the merge of the new base could not be checked, and a repair was paid for
    # to fix what the work cannot fix (nudged to remove the team's submodule).
    published = run_process("--json", "publish", "--task", str(task))
    assert published.exit_code == 1, published
    reason = _held(upgraded, task)
    assert "main moved to" in reason, reason
    assert "holds submodules (vendor/lib)" in reason, reason
    assert query(upgraded, "select count(*) from attempts where phase = 'repair'") == [(0,)]
    assert forge.client("alice").pulls("team", "app", state="all") == []


def test_a_base_with_a_name_that_is_not_utf8_asks_for_input(forge, claimed, upgraded, tmp_path):
    _reshape(forge, tmp_path, lambda work: (work / os.fsdecode(b"caf\xe9.txt")).write_text("1\n"))
    _, implemented = _implemented(claimed)
    _needs_input(upgraded, implemented, "names that are not UTF-8 (caf\\xe9.txt)")


def test_a_ci_run_sh_the_runner_would_refuse_asks_for_input(forge, claimed, upgraded, tmp_path):
    def build(work):
        git("mv", "ci/run.sh", "ci/run", cwd=work)
        (work / "ci" / "run").write_text(CHECKS)
        (work / "ci" / "run").chmod(0o755)
        (work / "ci" / "run.sh").write_text("helper() { :; }\n")  # sourced by ci/run
        (work / "ci" / "run.sh").chmod(0o644)

    _reshape(forge, tmp_path, build)
    # Before, the model ran, and the runner refused ci/run.sh: exit 2, budget charged.
    _, implemented = _implemented(claimed)
    _needs_input(upgraded, implemented, "`ci/run.sh` in the base")


def test_a_link_whose_target_is_not_utf8_is_checked(forge, claimed, upgraded, tmp_path):
    _reshape(forge, tmp_path, lambda work: os.symlink(os.fsdecode(b"caf\xe9"), work / "link"))
    # Before, every check crashed (UnicodeEncodeError), and each retry ran the model again.
    task, implemented = _implemented(claimed)
    assert implemented.exit_code == 0, implemented
    assert implemented.json()["outcome"] == "implemented", implemented.json()
    reports = deliver_until(task, "publish", "ci")
    assert all(r.exit_code == 0 for r in reports.values()), reports


def test_a_repository_without_commits_asks_for_input(forge, upgraded, tmp_path, cli, monkeypatch):
    from aiworker.sandbox.gitrepo import BareRepo
    from tests.delivery_fixtures import script_installation

    state = forge.app.state
    with state.lock:
        repo = state.add_repo("team", "empty")
        repo["collaborators"].update(
            dict.fromkeys(("worker-bot", "reviewer-bot", "planner-bot", "alice"), "write")
        )
        BareRepo(forge.data / "git" / "team" / "empty.git").init("main")
        issue = state.add_issue(repo, "alice", "Create calc.py", "Add calc.py with add(a, b).")
        issue["assignees"] = ["worker-bot"]
        state.record(issue, "assignees", "alice", assignee="worker-bot")
        state.save()
    config = script_installation(
        tmp_path, forge, monkeypatch, "", edits={"calc.py": FIX}, result=result_doc()
    )
    config.write_text(config.read_text().replace('name = "app"', 'name = "empty"'))
    assert cli("poll").exit_code == 0
    assert cli("--json", "claim", "--slot", "1").json()["claimed"]
    # Before, "git rev-parse failed in cache 1: no output", three times, and it failed.
    implemented = run_process("--json", "implement", "--task", "1", "--slot", "1")
    _needs_input(upgraded, implemented, "the repository has no commits on `main` yet")
