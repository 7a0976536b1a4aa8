"""The forge behind a reverse proxy that fails as nginx does. An answer to a change the
forge made is lost (a 502 or 504 after the forge was slow to answer): the step ends
unavailable instead of sending the change again, and its next run finds what was made,
so no pull request, review or merge is made twice. Git's fetch or push meets a 502: the
forge, not the work, failed, so the step is charged nothing and tried again."""

from __future__ import annotations

from tests.fault_proxy import FaultProxy, Rule
from tests.helpers import run_process
from tests.test_delivery import delivered  # noqa: F401 - fixture
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc


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
        Rule("POST", r"/pulls/\d+/reviews$", 504),
        Rule("POST", r"/pulls/\d+/merge$", 504),
    ]
    ran = {}
    try:
        for step in ("publish", "ci", "review", "merge"):
            ran[step] = [run_process("--json", step, "--task", str(task))]
            if step != "ci":
                ran[step].append(run_process("--json", step, "--task", str(task)))
    finally:
        proxy.stop()
    codes = {step: [r.exit_code for r in results] for step, results in ran.items()}
    assert codes == {"publish": [75, 0], "ci": [0], "review": [75, 0], "merge": [75, 0]}, ran
    assert "the forge may have acted on it before its answer was lost" in ran["review"][0].stderr
    assert len(proxy.lost) == 3
    worker = forge.client("worker-bot")
    [pull] = worker.pulls("team", "app", state="all")
    assert pull.merged
    reviews = worker.reviews("team", "app", pull.number)
    assert [(r.state, r.user.login, r.commit_id) for r in reviews] == [
        ("APPROVED", "reviewer-bot", head)
    ]
    assert query(upgraded, "select state from tasks") == [("done",)]
    # The lost answers cost no inference twice: one review by the model, the repost by
    # the host; publish and merge are refunded (the forge, not the work, failed).
    attempts = query(
        upgraded,
        "select phase, provider, outcome, refunded from attempts where phase != "
        "'implementation' order by id",
    )
    assert attempts == [
        ("publish", None, "unavailable", 1),
        ("publish", None, "succeeded", 0),
        ("ci", None, "succeeded", 0),
        ("review", "script", "error", 0),
        ("review", None, "succeeded", 0),
        ("merge", None, "unavailable", 1),
        ("merge", None, "succeeded", 0),
    ]


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
