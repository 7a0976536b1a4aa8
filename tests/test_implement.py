"""`aiworker implement` with the script provider against the sandbox forge."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import uuid

import pytest
import requests

from aiworker.runtime.gitcache import GitCache
from tests.delivery_fixtures import write_scenario
from tests.forge_fixtures import git
from tests.helpers import run_process

FIX = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a * b\n"


def result_doc(**extra):
    return {
        "contract": "ait.agent.result.v1",
        "completion": "complete",
        "summary": "Fixed add()",
        "validation": [{"check_id": "ci", "command": ["./ci/run"], "exit_code": 0}],
        **extra,
    }


SCRIPT_ONLY = '\nproviders = ["script"]\n[provider_options.script]\nscenario = "scenario.json"\n'


def query(db, sql):
    conn = sqlite3.connect(db)
    rows = conn.execute(sql).fetchall()
    conn.close()
    return rows


def test_implements_with_receipts_bound_to_the_head(claimed, upgraded, state_dir):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert result.exit_code == 0, result
    report = result.json()
    assert (report["outcome"], report["provider"]) == ("implemented", "script")
    assert report["gate"]["passed"] is True
    head, base = report["head"], report["base"]
    assert len(head) == 40
    assert head != base
    assert query(upgraded, "select state, head_commit, base_commit, claim_slot from tasks") == [
        ("implemented", head, base, None)
    ]
    assert query(upgraded, "select check_id, outcome, head_commit from receipts") == [
        ("ci", "pass", head)
    ]
    assert query(
        upgraded, "select provider, outcome, refunded, finished_at is not null from attempts"
    ) == [("script", "succeeded", 0, 1)]
    assert list((state_dir / "workspaces").iterdir()) == []


def test_an_agent_whose_edits_change_nothing_is_said_to_have_made_no_commits(claimed, upgraded):
    """Edits that leave every file as it was commit nothing (the script provider plays an
    agent that changed nothing): the attempt says so, not a crash of the agent."""
    unchanged = "def add(a, b):\n    return a - b\n"  # the seeded file, as it is
    task = claimed(SCRIPT_ONLY, edits={"calc.py": unchanged}, result=result_doc())
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert result.exit_code == 1, result
    assert result.json()["reason"] == "the agent made no commits"
    assert "Traceback" not in result.stderr
    assert query(upgraded, "select outcome, reason from attempts") == [
        ("failed", "the agent made no commits")
    ]


def test_picks_the_second_provider_when_the_first_is_below_reserve(claimed, tmp_path):
    write_scenario(tmp_path / "codex.json", windows=[{"name": "5h", "used_percent": 95}])
    task = claimed(
        '\nproviders = ["codex", "script"]\n[provider_options.codex]\n'
        'scenario = "codex.json"\n[provider_options.script]\nscenario = "scenario.json"\n',
        edits={"calc.py": FIX},
        result=result_doc(),
    )
    report = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert report["provider"] == "script"
    assert report["decisions"][0] == {
        "provider": "codex",
        "eligible": False,
        "reason": "deferred: window 5h headroom 5 is not above its reserve 10",
    }


def test_quota_failure_keeps_the_work_and_refunds_the_attempt(claimed, upgraded, state_dir):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, failure="quota_exhausted")
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert result.exit_code == 1, result
    report = result.json()
    assert report["outcome"] == "quota_exhausted"
    assert query(upgraded, "select outcome, refunded from attempts") == [("quota_exhausted", 1)]
    assert query(upgraded, "select state, claim_slot from tasks") == [("ready", None)]
    [kept] = list((state_dir / "workspaces").iterdir())
    assert (kept / "repo" / "calc.py").read_text() == FIX
    assert not (kept / "home").exists()
    assert report["head"] is not None  # the commits were imported into the cache
    failures = query(upgraded, "select reason from provider_observations where window = 'run'")
    assert failures[0][0].startswith("quota_exhausted")


def test_malformed_result_document_fails_with_a_reason(claimed, upgraded):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc(confidence=0.9))
    report = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert report["outcome"] == "failed"
    assert (
        report["reason"] == "malformed result document: confidence: Extra inputs are not permitted"
    )
    assert query(upgraded, "select state from tasks") == [("failed",)]
    assert query(upgraded, "select count(*) from receipts") == [(0,)]


def test_claimed_pass_that_fails_on_rerun_is_a_finding(claimed, upgraded):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": WRONG}, result=result_doc())
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert result.exit_code == 1
    report = result.json()
    assert report["gate"]["passed"] is False
    assert report["gate"]["findings"][0].startswith("check ci was reported passing by the agent")
    assert query(upgraded, "select outcome from receipts") == [("fail",)]
    assert query(upgraded, "select state from tasks") == [("failed",)]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("caf\udce9.txt", "the name 'caf\\xe9.txt' is not UTF-8"),
        ("d/" * 300 + "f", "a runner cannot write it: " + "d/" * 5),
    ],
    ids=["not-utf-8", "too-deep"],
)
def test_work_no_runner_can_write_is_refused_as_work_not_as_input(claimed, upgraded, name, why):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX, name: "x\n"}, result=result_doc())
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert result.exit_code == 1, result  # the agent's work failed, not the operator's input
    report = result.json()
    [finding] = report["gate"]["findings"]
    assert finding.startswith("the work at "), finding
    assert why in finding, finding
    assert len(finding) < 400
    [(outcome, reason)] = query(upgraded, "select outcome, reason from attempts")
    assert (outcome, reason) == ("gate_failed", finding)
    assert query(upgraded, "select state from tasks") == [("failed",)]
    assert query(upgraded, "select count(*) from receipts") == [(0,)]


@pytest.mark.parametrize(
    ("claims", "refusal"),
    [
        (
            {
                "criteria": [
                    {"criterion": "add handles floats", "satisfied": False, "evidence": "-"}
                ]
            },
            "criterion not satisfied: add handles floats",
        ),
        ({"blockers": ["cannot reach the test server"]}, "blocker: cannot reach the test server"),
        ({"scope": {"changed": True, "note": "also rewrote mul()"}}, "the scope changed"),
        (
            {"findings": [{"severity": "blocker", "message": "breaks sub()", "path": "calc.py"}]},
            "blocking finding (calc.py): breaks sub()",
        ),
        ({"completion": "blocked"}, "the agent reported blocked, not complete"),
    ],
    ids=["criterion", "blocker", "scope", "finding", "completion"],
)
def test_a_result_is_judged_by_its_claims_not_its_summary(claimed, upgraded, claims, refusal):
    """The checks pass and the summary says "Fixed add()": what the result itself
    reports still refuses it."""
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc(**claims))
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert result.exit_code == 1, result
    report = result.json()
    assert report["gate"]["passed"] is True
    assert report["outcome"] == "failed"
    assert refusal in report["reason"]
    assert query(upgraded, "select state from tasks") == [("failed",)]
    published = run_process("--json", "publish", "--task", str(task))
    assert published.exit_code == 1


def test_a_result_with_questions_waits_for_answers_on_the_issue(claimed, forge, upgraded):
    task = claimed(
        SCRIPT_ONLY,
        edits={"calc.py": FIX},
        result=result_doc(questions=["Should add() accept floats too?"]),
    )
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert result.exit_code == 1, result
    assert (result.json()["outcome"], result.json()["state"]) == ("needs_input", "needs_input")
    assert query(upgraded, "select state from tasks") == [("needs_input",)]
    [comment] = [
        c for c in forge.client("alice").comments("team", "app", 1) if "needs answers" in c.body
    ]
    assert "- Should add() accept floats too?" in comment.body
    assert query(upgraded, "select outcome from attempts") == [("needs_input",)]


LLAMA_FIRST = (
    '\nproviders = ["llama", "script"]\n[provider_options.llama]\nscenario = "llama.json"\n'
    "diff_budget_lines = 20\n"
    '[provider_options.script]\nscenario = "scenario.json"\n'
)


def test_llama_gets_one_local_try_within_its_diff_budget(claimed, forge, upgraded, tmp_path):
    alice = forge.client("alice")
    alice.ensure_labels("team", "app", ["aiworker-simple"])
    alice.add_labels("team", "app", 1, ["aiworker-simple"])
    bloated = FIX + "".join(f"# padding {n}\n" for n in range(40))
    write_scenario(tmp_path / "llama.json", edits={"calc.py": bloated}, result=result_doc())
    task = claimed(LLAMA_FIRST, edits={"calc.py": FIX}, result=result_doc())
    first = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert (first["provider"], first["outcome"]) == ("llama", "fell_back")
    assert first["reason"] == (
        "llama's local try ended over_budget: llama changed 42 lines, over its budget of 20"
    )
    assert query(upgraded, "select state from tasks") == [("ready",)]
    assert query(upgraded, "select provider, outcome from attempts") == [("llama", "over_budget")]
    assert run_process("--json", "claim", "--slot", "1").json()["claimed"]
    second = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert (second["provider"], second["outcome"]) == ("script", "implemented")
    assert (
        second["decisions"][0]["reason"] == "llama already had its one local try at this snapshot"
    )


def test_a_local_try_the_gate_refuses_falls_back_to_the_next_provider(
    claimed, forge, upgraded, tmp_path
):
    """Whatever way the local try fails (here: its change breaks the repository's checks)
    the task goes on with the next provider on the same attempt budget."""
    alice = forge.client("alice")
    alice.ensure_labels("team", "app", ["aiworker-simple"])
    alice.add_labels("team", "app", 1, ["aiworker-simple"])
    write_scenario(
        tmp_path / "llama.json",
        edits={"calc.py": WRONG},
        result=result_doc(),
    )
    task = claimed(LLAMA_FIRST, edits={"calc.py": FIX}, result=result_doc())
    first = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert (first["provider"], first["outcome"], first["state"]) == ("llama", "fell_back", "ready")
    assert first["reason"].startswith("llama's local try ended gate_failed: ")
    assert run_process("--json", "claim", "--slot", "1").json()["claimed"]
    second = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert (second["provider"], second["outcome"]) == ("script", "implemented")
    assert query(upgraded, "select provider, outcome from attempts order by id") == [
        ("llama", "gate_failed"),
        ("script", "succeeded"),
    ]


def test_a_local_try_with_no_provider_after_it_fails_the_task_with_every_try_named(
    claimed, forge, upgraded, tmp_path
):
    alice = forge.client("alice")
    alice.ensure_labels("team", "app", ["aiworker-simple"])
    alice.add_labels("team", "app", 1, ["aiworker-simple"])
    write_scenario(tmp_path / "llama.json", edits={}, result=result_doc())
    only_llama = '\nproviders = ["llama"]\n[provider_options.llama]\nscenario = "llama.json"\n'
    task = claimed(only_llama, edits={"calc.py": FIX}, result=result_doc())
    report = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert (report["outcome"], report["state"]) == ("failed", "failed")
    assert report["reason"] == (
        "llama's local try ended failed: the agent made no commits; "
        "no other configured provider can take this issue"
    )
    [comment] = [c for c in alice.comments("team", "app", 1) if "stopped working on this" in c.body]
    assert "- attempt 1 (implementation, llama): failed: the agent made no commits" in comment.body


def test_llama_does_not_take_work_not_marked_simple(claimed, tmp_path):
    write_scenario(tmp_path / "llama.json", edits={"calc.py": FIX}, result=result_doc())
    task = claimed(LLAMA_FIRST, edits={"calc.py": FIX}, result=result_doc())
    report = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert report["provider"] == "script"
    assert report["decisions"][0]["reason"] == (
        "llama serves only simple milestones and minor review fixes"
    )


CANARY = "canary-provider-credential-7c41e2"


def test_a_credential_in_the_private_home_never_leaks(claimed, upgraded, state_dir):
    task = claimed(
        SCRIPT_ONLY,
        edits={"calc.py": FIX},
        home_files={"auth.json": CANARY},
        stderr=f"refreshing token {CANARY}",
        failure="quota_exhausted",
    )
    result = run_process("-vv", "--json", "implement", "--task", str(task), "--slot", "1")
    assert result.json()["outcome"] == "quota_exhausted"
    assert CANARY not in result.stdout + result.stderr
    [kept] = list((state_dir / "workspaces").iterdir())  # preserved for the retry
    assert not (kept / "home").exists()
    for path in kept.rglob("*"):
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path
    conn = sqlite3.connect(upgraded)
    dump = "\n".join(conn.iterdump())
    conn.close()
    assert CANARY not in dump


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def test_issue_images_are_checked_and_handed_over_as_files(claimed, forge, upgraded, state_dir):
    """The host fetches the issue's images through the forge: a real PNG is handed over
    with its metadata; an oversized one, bytes that are not an image, a reference to
    a missing attachment and an outside link are listed with the reason instead."""
    headers = {"Authorization": f"token {forge.tokens['alice']}"}
    assets = f"{forge.url}/api/v1/repos/team/app/issues/1/assets"
    for name, data in (
        ("screen.png", PNG),
        ("fake.png", b"just text, not an image"),
        ("huge.png", PNG + b"\x00" * (5 * 1024 * 1024)),
    ):
        uploaded = requests.post(
            assets, params={"name": name}, data=data, headers=headers, timeout=30
        )
        assert uploaded.status_code == 201, uploaded.text
    missing = uuid.uuid4()
    body = forge.client("alice").issue("team", "app", 1).body + (
        f"\n\n![gone]({forge.url}/attachments/{missing})\n![elsewhere](https://example.com/a.png)\n"
    )
    edited = requests.patch(
        f"{forge.url}/api/v1/repos/team/app/issues/1", json={"body": body}, headers=headers
    )
    assert edited.ok, edited.text
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, keep_inputs="seen", result=result_doc())
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert result.exit_code == 0, result
    cache = GitCache(state_dir).path(1)
    head = result.json()["head"]

    def shown(path: str) -> bytes:
        done = subprocess.run(
            ["git", "--git-dir", str(cache), "show", f"{head}:{path}"],
            capture_output=True,
            check=True,
        )
        return done.stdout

    context = json.loads(shown("seen/context.json"))
    assert context["images"] == [
        {
            "file": "images/1-screen.png",
            "name": "screen.png",
            "type": "image/png",
            "size": len(PNG),
            "sha256": hashlib.sha256(PNG).hexdigest(),
        }
    ]
    reasons = {entry["name"]: entry["reason"] for entry in context["images_not_given"]}
    assert reasons["fake.png"] == "its bytes are not a PNG, JPEG, GIF or WebP image"
    assert reasons["huge.png"].endswith("over the 5242880-byte cap")
    assert reasons[str(missing)] == "referenced, but no such attachment"
    assert reasons["https://example.com/a.png"] == "not an attachment of this forge"
    assert shown("seen/images/1-screen.png") == PNG
    listed = git("--git-dir", str(cache), "ls-tree", "-r", "--name-only", head, "seen").stdout
    assert sorted(listed.split()) == [
        "seen/context.json",
        "seen/continuation.json",
        "seen/images/1-screen.png",
        "seen/prompt.md",
        "seen/result-schema.json",
        "seen/settings.json",
        "seen/stdin",  # the prompt as the provider's stdin
    ]
    # What the phase was handed outlives its workspace in the artifact store.
    kept = dict(
        query(upgraded, "select name, media_type from artifacts where attempt_id is not null")
    )
    assert kept["input/images/1-screen.png"] == "image/png"
    assert kept["input/continuation.json"] == kept["input/context.json"] == "application/json"
    [(digest,)] = query(
        upgraded, "select sha256 from artifacts where name = 'input/images/1-screen.png'"
    )
    assert digest == hashlib.sha256(PNG).hexdigest()


def test_a_later_attempt_starts_fresh_with_the_continuation_artifact(
    claimed, upgraded, state_dir, tmp_path, cli
):
    """No conversation carries over: the second attempt gets continuation.json, built by
    the host from its records (how the first attempt ended), valid by its schema."""
    from aiworker.contracts.continuation import Continuation

    task = claimed(SCRIPT_ONLY, edits={"calc.py": WRONG}, result=result_doc())
    first = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert first.json()["outcome"] == "failed"
    assert cli("task", "retry", str(task)).exit_code == 0
    write_scenario(
        tmp_path / "scenario.json", edits={"calc.py": FIX}, keep_inputs="seen", result=result_doc()
    )
    assert cli("--json", "claim", "--slot", "1").json()["claimed"]
    second = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert second.exit_code == 0, second
    shown = subprocess.run(
        [
            "git",
            "--git-dir",
            str(GitCache(state_dir).path(1)),
            "show",
            f"{second.json()['head']}:seen/continuation.json",
        ],
        capture_output=True,
        check=True,
    ).stdout
    document = Continuation.model_validate_json(shown)
    assert (document.task, document.phase, document.base) == (
        task,
        "implementation",
        second.json()["base"],
    )
    assert document.scope.checks == [["ci", "./ci/run"]]
    assert [(a.phase, a.provider, a.outcome) for a in document.attempts] == [
        ("implementation", "script", "gate_failed")
    ]
    [failed] = [e for e in document.evidence if e.outcome == "fail"]
    assert (failed.check_id, failed.head) == ("ci", first.json()["head"])
    schema = run_process("runner", "schema", "continuation")
    assert schema.exit_code == 0
    assert json.loads(schema.stdout) == Continuation.model_json_schema()


def test_a_token_the_forge_refuses_holds_the_task_and_spends_nothing(claimed, upgraded):
    """A revoked token is the installation's fault: another try would meet it again. The
    attempt is given back, and the task waits for the operator instead of failing."""
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    revoked = {"AIWORKER_TEST_WORKER_TOKEN": "revoked-0123456789abcdef"}
    result = run_process("--json", "implement", "--task", str(task), "--slot", "1", env=revoked)
    assert result.exit_code == 2, result
    assert result.json()["error"]["code"] == "forge_unauthorized"
    assert query(upgraded, "select state, claim_slot from tasks") == [("paused", None)]
    assert query(upgraded, "select outcome, refunded from attempts") == [("unavailable", 1)]
    assert query(upgraded, "select used from budgets") == [(0,)]
    [(data,)] = query(upgraded, "select data from events where kind = 'task.held'")
    reason = json.loads(data)["reason"]
    assert "HTTP 401" in reason
    assert reason.endswith(
        f"held until an operator fixes it and runs `aiworker task resume {task}`"
    )
    resumed = run_process("--json", "task", "resume", str(task))
    assert resumed.json()["state"] == "ready", resumed
