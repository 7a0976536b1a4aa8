"""The forge behind a reverse proxy that fails as nginx does. The answer to a change the
forge made is lost (a 502 or 504 after the forge was slow to answer): what was made is
looked for before it is made again, so no pull request, review, comment or merge is
made twice, and a commit status (the latest counts) is simply sent again. Git's fetch
or push meets a 502: the forge, not the work, failed, so the step is charged nothing
and tried again."""

from __future__ import annotations

from tests.fault_proxy import FaultProxy, Rule
from tests.helpers import run_process
from tests.test_delivery import delivered  # noqa: F401 - fixture
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc

STEPS = ("publish", "ci", "review", "merge")


def test_a_change_whose_answer_was_lost_is_found_not_made_again(
    forge,
    delivered,  # noqa: F811
    upgraded,
    tmp_path,
):
    task, head = delivered()
    proxy = FaultProxy(forge.url).start()
    config = tmp_path / "config.toml"
    config.write_text(config.read_text().replace(forge.url, proxy.url))
    proxy.rules = [
        Rule("POST", r"/pulls$", 502),
        Rule("POST", r"/statuses/[0-9a-f]+$", 504, times=2),
        Rule("POST", r"/pulls/\d+/reviews$", 504),
        Rule("POST", r"/pulls/\d+/merge$", 504),
    ]
    try:
        ran = {s: run_process("--json", s, "--task", str(task)) for s in STEPS}
    finally:
        proxy.stop()
    assert {s: r.exit_code for s, r in ran.items()} == dict.fromkeys(STEPS, 0), ran
    assert len(proxy.lost) == 5
    worker = forge.client("worker-bot")
    [pull] = worker.pulls("team", "app", state="all")
    assert pull.merged
    reviews = worker.reviews("team", "app", pull.number)
    assert [(r.state, r.user.login, r.commit_id) for r in reviews] == [
        ("APPROVED", "reviewer-bot", head)
    ]
    combined = worker.combined_status("team", "app", head)
    assert [(s.context, s.status) for s in combined.statuses] == [("aiworker / ci", "success")]
    assert query(upgraded, "select state from tasks") == [("done",)]
    # Nothing was run or charged twice: one CI run, one review by the model.
    attempts = query(
        upgraded,
        "select phase, provider, outcome from attempts where phase != 'implementation' order by id",
    )
    assert attempts == [
        ("publish", None, "succeeded"),
        ("ci", None, "succeeded"),
        ("review", "script", "succeeded"),
        ("merge", None, "succeeded"),
    ]
    assert query(upgraded, "select count(*) from receipts where phase = 'ci'") == [(1,)]


def test_git_meeting_an_outage_charges_nothing_and_is_tried_again(
    forge, claimed, upgraded, tmp_path
):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    proxy = FaultProxy(forge.url).start()
    config = tmp_path / "config.toml"
    config.write_text(config.read_text().replace(forge.url, proxy.url))
    proxy.rules = [Rule("POST", r"/git-upload-pack$", 502, times=3, forward=False)]
    try:
        for _ in range(3):  # a task failed by its budget before, with nothing run
            implemented = run_process("--json", "implement", "--task", str(task), "--slot", "1")
            assert implemented.exit_code == 75, implemented
            said = implemented.json()["error"]["message"]
            assert "git fetch could not get through to the forge (RPC failed; HTTP 502" in said
            assert query(upgraded, "select state from tasks") == [("ready",)]
            assert run_process("--json", "claim", "--slot", "1").json()["task"] == task
        implemented = run_process("--json", "implement", "--task", str(task), "--slot", "1")
        assert implemented.exit_code == 0, implemented
        proxy.rules = [Rule("POST", r"/git-receive-pack$", 502, forward=False)]
        published = run_process("--json", "publish", "--task", str(task))
        assert published.exit_code == 75, published
        assert "git push could not get through" in published.json()["error"]["message"]
        assert query(upgraded, "select state from tasks") == [("implemented",)]
        assert run_process("--json", "publish", "--task", str(task)).exit_code == 0
    finally:
        proxy.stop()
    attempts = query(upgraded, "select phase, outcome, refunded from attempts order by id")
    assert attempts == [
        *[("implementation", "unavailable", 1)] * 3,
        ("implementation", "succeeded", 0),
        ("publish", "unavailable", 1),
        ("publish", "succeeded", 0),
    ]
    [pull] = forge.client("worker-bot").pulls("team", "app", state="all")
    assert pull.head.sha == implemented.json()["head"]
