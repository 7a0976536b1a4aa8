"""The page in headless Chromium (Debian's, driven by Playwright): it loads without console
errors, shows a seeded task's history, saves a setting and pauses the scheduler through
the UI. A screenshot is kept in test-artifacts/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import run_process
from tests.test_web_api import web  # noqa: F401 - the running server fixture

CHROMIUM = shutil.which("chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed"),
]


def seed_task(db_path: Path) -> None:
    from aiworker.core.tasks.lifecycle import advance
    from aiworker.store.attempts import finish_attempt, set_attempt_files, start_attempt
    from aiworker.store.engine import Database
    from aiworker.store.task_records import create_task, ensure_repository

    # An attempt whose provider failed, with what it printed kept beside the database.
    output = db_path.parent / "attempts" / "task-1-attempt-1" / "output.log"
    output.parent.mkdir(parents=True)
    output.write_text("--- stderr (its end) ---\nTraceback: the model gave up\n")
    db = Database(f"sqlite:///{db_path}")
    with db.write() as session:
        repo = ensure_repository(session, 1, "team", "app")
        task = create_task(session, repo.id, "issue", issue_number=4, title="Crash on start")
        attempt = start_attempt(session, task.id, "implementation", "script", None, None, {})
        set_attempt_files(session, attempt, None, None, str(output))
        finish_attempt(session, attempt, "transient", reason="script provider exited 1")
        advance(session, task.id, "ready", task.version, "needs_input", "no ci/run at the base")
    db.dispose()


def test_the_page_shows_history_saves_a_setting_and_pauses(web, upgraded):  # noqa: F811
    from playwright.sync_api import sync_playwright

    url, config = web
    seed_task(upgraded)
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1600})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url + "/")
            page.wait_for_selector("#tasks tbody tr.task")
            assert "Crash on start" in page.inner_text("#tasks")
            page.click("#tasks tbody tr.task")
            page.wait_for_selector("#history tbody tr")
            history = page.inner_text("#history")
            assert "ready -> needs_input" in history
            assert "no ci/run at the base" in history
            attempts = page.inner_text("#attempts")
            assert "script provider exited 1" in attempts
            assert "Traceback: the model gave up" in attempts
            page.wait_for_selector("input[name='check_interval']")
            page.fill("input[name='check_interval']", "240")
            page.click("#save-settings")
            # The page's CSP allows no eval: wait on the message's text, not on a script.
            page.locator("#message", has_text="saved (revision").wait_for()
            page.click("#pause")
            page.wait_for_selector("#scheduler.paused")
            assert "PAUSED (paused from the web page)" in page.inner_text("#scheduler")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "web-page.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert "check_interval = 240" in config.read_text()
    status = run_process("--json", "scheduler", "status").json()
    assert (status["paused"], status["paused_reason"]) == (True, "paused from the web page")
    assert (ARTIFACTS / "web-page.png").stat().st_size > 10_000
