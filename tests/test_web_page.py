"""The page in headless Chromium (Debian's, driven by Playwright), as an operator uses it:
states in colour, relative times with the exact time on hover, links to the forge,
retry and cancel per task, pause with a reason, settings as a typed form; at 1280 and
390 px wide, by keyboard, without console errors and without serious or critical
accessibility findings from axe-core. Screenshots are kept in test-artifacts/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import run_process
from tests.test_web_api import web  # noqa: F401 - the running server fixture

CHROMIUM = shutil.which("chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
# Installed by `make test` from npm (see the Makefile); the page's test injects it.
AXE = Path(__file__).resolve().parent.parent / ".cache/npm/node_modules/axe-core/axe.min.js"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed"),
]


def seed_tasks(db_path: Path) -> None:
    """A task that failed after its provider gave up (its output kept), one that waits
    for input, one held for the operator, and one whose title no page should trust."""
    from aiworker.core.tasks.hold import hold_task
    from aiworker.core.tasks.lifecycle import advance
    from aiworker.store.attempts import finish_attempt, set_attempt_files, start_attempt
    from aiworker.store.engine import Database
    from aiworker.store.task_records import create_task, ensure_repository

    output = db_path.parent / "attempts" / "task-1-attempt-1" / "output.log"
    output.parent.mkdir(parents=True)
    output.write_text("--- stderr (its end) ---\nTraceback: the model gave up\n")
    db = Database(f"sqlite:///{db_path}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        failed = create_task(session, repo.id, "issue", issue_number=4, title="Crash on start")
        attempt = start_attempt(session, failed.id, "implementation", "script", None, None, {})
        set_attempt_files(session, attempt, None, None, str(output))
        finish_attempt(session, attempt, "transient", reason="script provider exited 1")
        version = advance(session, failed.id, "ready", failed.version, "claimed", "claimed")
        version = advance(session, failed.id, "claimed", version, "running", "implementing")
        advance(session, failed.id, "running", version, "failed", "the budget is spent")
        waiting = create_task(session, repo.id, "issue", issue_number=5, title="Slow login")
        advance(session, waiting.id, "ready", waiting.version, "needs_input", "no ci/run")
        held = create_task(session, repo.id, "issue", issue_number=6, title="Dark mode")
        held_at = (held.id, held.state, held.version)
        # Anyone's text from the forge: a direction override and one unbroken long word.
        title = "RTL \u202eevil\u202c " + "x" * 3000
        create_task(session, repo.id, "issue", issue_number=7, title=title)
    db.dispose()
    hold_task(Database(f"sqlite:///{db_path}"), *held_at, "team/app is archived", "publish")


def accessibility_findings(page) -> list[str]:
    """Serious or critical findings of axe-core on the page as it is now."""
    # Evaluated through the browser's devtools channel: the page's own CSP (scripts from
    # its own file only) stays in force for everything the page itself does.
    page.evaluate(AXE.read_text() + "\n;undefined")
    results = page.evaluate("async () => await axe.run(document)")
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
        for v in results["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def test_the_page_shows_steers_and_passes_axe_at_both_widths(web, upgraded):  # noqa: F811
    from playwright.sync_api import sync_playwright

    assert AXE.is_file(), "axe-core is missing: run `make test` (it installs it from npm)"
    url, config = web
    seed_tasks(upgraded)
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("dialog", lambda dialog: dialog.accept())  # the cancel confirmation
            page.goto(url + "/")
            page.wait_for_selector("#tasks tbody tr.task")
            tasks = page.inner_text("#tasks")
            assert "Crash on start" in tasks
            assert "RTL \\u202eevil\\u202c xxx" in tasks  # not read as "RTL live"
            table = page.evaluate("document.querySelector('#tasks').scrollWidth")
            assert table <= 1280, f"a long title makes the tasks table {table} px wide"
            assert page.locator("#tasks .state-failed").inner_text() == "failed"
            assert page.locator("#tasks .state-needs_input").inner_text() == "needs_input"
            updated = page.locator("#tasks time").first
            assert updated.inner_text().endswith("ago") or updated.inner_text() == "just now"
            assert updated.get_attribute("title").endswith(" UTC")  # exact time on hover
            issue = page.locator("#tasks a", has_text="team/app#4")
            assert issue.get_attribute("href") == "http://127.0.0.1:9/team/app/issues/4"
            # By keyboard: the task's button takes focus and Enter opens it.
            page.focus("#tasks button[aria-label='show task 1']")
            page.keyboard.press("Enter")
            page.locator("#attempts", has_text="Traceback: the model gave up").wait_for()
            assert "script provider exited 1" in page.inner_text("#attempts")
            assert page.is_enabled("#retry-task")
            assert not page.is_enabled("#resume-task")  # for a held (paused) task only
            page.click("#retry-task")
            page.locator("#message", has_text="task 1: retry done").wait_for()
            page.locator("#task-id .state-ready").wait_for()
            page.click("#cancel-task")
            page.locator("#message", has_text="task 1: cancel done").wait_for()
            page.locator("#task-id .state-cancelled").wait_for()
            # What waits for the operator, named with its reason, is resumed from here.
            assert "team/app is archived" in page.inner_text("#held")
            page.click("#held button[aria-label='show held task 3']")
            page.locator("#task-id .state-paused").wait_for()
            page.click("#resume-task")
            page.locator("#message", has_text="task 3: resume done").wait_for()
            page.locator("#task-id .state-ready").wait_for()
            # Settings as a typed form made from the capability metadata.
            interval = page.locator("input[name='check_interval']")
            assert interval.get_attribute("type") == "number"
            assert interval.get_attribute("min") == "10"
            assert page.locator("input[name='providers']").get_attribute("type") == "text"
            interval.fill("240")
            page.fill("input[name='providers']", "script")
            page.click("#save-settings")
            # The page's CSP allows no eval: wait on the message's text, not on a script.
            page.locator("#message", has_text="saved (revision").wait_for()
            # A provider's setting no phase sets is shown as it applies: enabled.
            enabled = "input[name='phases.implementation.providers.script.enabled']"
            page.locator(enabled).wait_for()
            assert page.is_checked(enabled)
            page.fill("#pause-reason", "forge upgrade tonight")
            page.click("#pause")
            page.locator("#scheduler", has_text="PAUSED by the web control plane").wait_for()
            assert "forge upgrade tonight" in page.inner_text("#scheduler")
            # Start now while paused: the check is asked for, and the page says it starts
            # no work until the scheduler is resumed (not "done").
            page.click("#start-now")
            page.locator(
                "#message",
                has_text="check requested; the scheduler is paused: forge upgrade tonight "
                "(by the web control plane); no work starts until it is resumed",
            ).wait_for()
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "web-page-1280.png"), full_page=True)
            wide = accessibility_findings(page)
            page.set_viewport_size({"width": 390, "height": 844})
            page.reload()
            page.wait_for_selector("#tasks tbody tr.task")
            # Nothing but the tables' own scrolling areas is wider than the screen.
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"the page is {width} px wide at 390 px"
            page.screenshot(path=str(ARTIFACTS / "web-page-390.png"), full_page=True)
            narrow = accessibility_findings(page)
        finally:
            browser.close()
    assert errors == []
    assert wide == []
    assert narrow == []
    assert "check_interval = 240" in config.read_text()
    status = run_process("--json", "scheduler", "status").json()
    assert (status["paused"], status["paused_reason"]) == (True, "forge upgrade tonight")
    assert run_process("--json", "task", "show", "1").json()["state"] == "cancelled"
    for width in (1280, 390):
        assert (ARTIFACTS / f"web-page-{width}.png").stat().st_size > 10_000


def test_a_receipt_page_shows_the_check_escaped_and_passes_axe(web, upgraded):  # noqa: F811
    """The page a CI status links to: the check as it ran, its digests and masked tails;
    what the check printed is shown as text, never run as markup."""
    from playwright.sync_api import sync_playwright

    from aiworker.store.engine import Database
    from aiworker.store.receipts import add_receipt

    url, _ = web
    hostile = "<script>document.title='owned'</script><img src=x onerror=alert(1)>"
    db = Database(f"sqlite:///{upgraded}")
    with db.write() as session:
        receipt = add_receipt(
            session,
            task_id=None,
            phase="ci",
            head="a" * 40,
            base="b" * 40,
            scope=None,
            check_id="ci",
            outcome="fail",
            body={
                "command": ["./ci/run"],
                "status": "command_failed",
                "exit_code": 3,
                "expected_exit_code": 0,
                "duration_ms": 1234,
                "stdout_sha256": "c" * 64,
                "stderr_sha256": "d" * 64,
                "stdout_tail": "ran 4 tests\n" + hostile,
                "stderr_tail": "FAILED (failures=1)\n",
            },
        )
    db.dispose()
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 390, "height": 844})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("dialog", lambda dialog: errors.append(f"dialog {dialog.message}"))
            page.goto(f"{url}/receipts/{receipt}")
            assert page.title() == f"aiworker receipt {receipt}"
            assert page.inner_text("h1") == f"Receipt {receipt}: fail"
            text = page.inner_text("main")
            for shown in ("./ci/run", "command_failed", "3 (expected 0)", "a" * 40, "c" * 64):
                assert shown in text, shown
            assert hostile in page.inner_text("pre >> nth=0")  # as text, not markup
            assert page.locator("main img, main script").count() == 0
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"the page is {width} px wide at 390 px"
            findings = accessibility_findings(page)
        finally:
            browser.close()
    assert errors == []
    assert findings == []


def test_a_page_whose_server_stops_marks_what_it_shows_as_old(upgraded, tmp_path, monkeypatch):
    """The server goes away (a restart, a crash): the page keeps what it showed, marked
    as read at its time and dimmed, so that it is not taken for the state now; once the
    server answers again, it says so and shows the state now."""
    import os
    import socket

    from playwright.sync_api import sync_playwright

    from tests.test_web_api import serving

    config = tmp_path / "config.toml"
    config.write_text("shares = 1\n")
    os.chmod(config, 0o600)
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))
    seed_tasks(upgraded)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        listen = f"127.0.0.1:{probe.getsockname()[1]}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            with serving("--listen", listen) as url:
                page.goto(url + "/")
                page.wait_for_selector("#tasks tbody tr.task")
            page.locator("#message", has_text="refresh failed at ").wait_for(timeout=30_000)
            assert "; what is shown was read at " in page.inner_text("#message")
            assert page.get_attribute("main", "class") == "stale"
            assert "Crash on start" in page.inner_text("#tasks")  # kept, marked
            with serving("--listen", listen):
                page.locator("#message", has_text="the server answers again").wait_for(
                    timeout=30_000
                )
                assert page.get_attribute("main", "class") == ""
        finally:
            browser.close()
