"""`make demo`: run what aiworker can do today, end to end, on embedded defaults.

Every step is a real `aiworker` command in a fresh process against a private
state directory under .demo/ and a sandbox forge on loopback; the demo says
what each step did.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from aiworker.demo_plan import run_plan_scenario
from aiworker.runtime.processes import run_command, spawn_detached

DEMO = Path(".demo").absolute()
# An empty PostgreSQL database to run the demo on instead of SQLite (postgresql://...).
DATABASE_ENV = "AIWORKER_DEMO_DATABASE_URL"
ROLES = {
    "planner": "planner-bot",
    "worker": "worker-bot",
    "reviewer": "reviewer-bot",
    "operator": "admin",
}


def aiworker(*args: str, wait_for_lock: bool = False, state: str = "state") -> str:
    """Run one aiworker command (on the state directory .demo/STATE); WAIT_FOR_LOCK:
    while a job the scheduler started holds the lock it needs, try again (for 30 s)."""
    argv = [sys.executable, "-m", "aiworker", "--state-dir", str(DEMO / state)]
    argv += ["--config", str(DEMO / "config.toml"), *args]
    deadline = time.monotonic() + 30
    result = run_command(argv, timeout=120)
    while wait_for_lock and "still running" in result.stderr and time.monotonic() < deadline:
        time.sleep(0.2)
        result = run_command(argv, timeout=120)
    if not result.ok:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"demo step failed: aiworker {' '.join(args)} (exit {result.returncode})")
    return result.stdout


STARTED = time.monotonic()


def step(title: str) -> None:
    sys.stdout.write(f"\n== [{time.monotonic() - STARTED:6.1f} s] {title}\n")


def say(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


SCENARIO = {
    "edits": {"calc.py": "def add(a, b):\n    return a + b\n"},
    "commit_message": "Fix add() to return the sum",
    "result": {
        "contract": "ait.agent.result.v1",
        "completion": "complete",
        "summary": "add() now returns a + b; test_calc passes.",
        "validation": [{"check_id": "ci", "command": ["./ci/run"], "exit_code": 0}],
    },
    "phases": {
        "review": {
            "result": {
                "contract": "ait.agent.result.v1",
                "completion": "complete",
                "summary": "add() returns the sum and test_calc covers it.",
                "findings": [],
            }
        }
    },
}


DELIVERY = ("implemented", "awaiting_ci", "awaiting_review", "approved", "done")


def wait_for_state(state: str, timeout: float = 120) -> None:
    """Wait until the demo's task reaches STATE or a later one (each phase runs as its own
    process, and a job that made progress asks for the next check itself)."""
    from aiworker.store.engine import Database, default_url
    from aiworker.store.tasks import task_state

    # Read the store directly: a CLI process per look would cost more than the jobs.
    db = Database(os.environ.get(DATABASE_ENV) or default_url(DEMO / "state"))
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with db.read_connection() as connection:
                found = task_state(connection, 1)
            current = found[0] if found else "none"
            if current in DELIVERY and DELIVERY.index(current) >= DELIVERY.index(state):
                return
            if current in ("failed", "needs_input", "cancelled"):
                raise SystemExit(f"the task is {current}; see `aiworker task show 1`")
            time.sleep(0.1)
    finally:
        db.dispose()
    raise SystemExit(f"the task did not reach {state}; see .demo/state/logs/")


def show_delivery(url: str, token: str) -> None:
    from aiworker.adapters.forgejo import ForgejoClient

    client = ForgejoClient(url, token)
    [pull] = client.pulls("team", "app", state="all")
    say(f"PR #{pull.number} '{pull.title}': merged={pull.merged} as {pull.merge_commit_sha}")
    head = pull.head.sha
    status = client.combined_status("team", "app", head)
    for item in status.statuses:
        say(f"status {item.context}: {item.status} on {head} ({item.description})")
    for review in client.reviews("team", "app", pull.number):
        login = review.user.login if review.user else "?"
        say(f"review by {login}: {review.state} on {review.commit_id}")
    log = run_command(
        [
            "git",
            "--git-dir",
            str(DEMO / "forge" / "git" / "team" / "app.git"),
            "log",
            "--oneline",
            "-3",
            "main",
        ],
        timeout=30,
    )
    say("main now:\n" + log.stdout)


def start_forge() -> tuple[int, str]:
    log = DEMO / "forge.log"
    pid = spawn_detached(
        [
            sys.executable,
            "-m",
            "aiworker",
            "sandbox",
            "serve",
            "--data",
            str(DEMO / "forge"),
            "--port",
            "0",
        ],
        log_path=log,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        if "sandbox forge at " in text:
            return pid, text.split("sandbox forge at ", 1)[1].split()[0].rstrip("/")
        time.sleep(0.1)
    raise SystemExit("the sandbox forge did not start; see .demo/forge.log")


def configure(url: str, tokens: dict[str, str]) -> str | None:
    """Write the demo's configuration; returns the PostgreSQL URL it uses, if any."""
    step("Write the configuration with `config set` (tokens live in 0600 files)")
    aiworker("config", "set", "forge.url", url)
    (DEMO / "tokens").mkdir(mode=0o700)
    for role, login in ROLES.items():
        path = DEMO / "tokens" / f"{role}.token"
        path.write_text(tokens[login] + "\n")
        os.chmod(path, 0o600)
        aiworker("config", "set", f"forge.identities.{role}.token_file", str(path))
    aiworker("config", "set", "repositories", '[{index = 1, owner = "team", name = "app"}]')
    aiworker("config", "set", "shares", "2")
    scenario = DEMO / "scenario.json"
    scenario.write_text(json.dumps(SCENARIO, indent=2))
    aiworker("config", "set", "providers", '["script"]')
    aiworker("config", "set", "provider_options.script.scenario", str(scenario))
    say("the script provider replays .demo/scenario.json instead of calling a model")
    database = os.environ.get(DATABASE_ENV)
    if database:
        aiworker("config", "set", "database.url", database)
        say("the store is the PostgreSQL database $AIWORKER_DEMO_DATABASE_URL names")
    say(aiworker("config", "validate"))
    return database


def main() -> None:
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    step("Seed a sandbox forge: users with tokens, team/app with a failing test, two issues")
    seeded = json.loads(aiworker("--json", "sandbox", "seed", "--data", str(DEMO / "forge")))
    tokens = {user["login"]: user["token"] for user in seeded["users"]}
    issues = seeded["repositories"][0]["issues"]
    say(f"users: {', '.join(tokens)}; repository team/app issues {issues}")
    pid, url = start_forge()
    say(f"sandbox forge serving at {url} (pid {pid})")
    try:
        database = configure(url, tokens)

        step("Create the database and migrate it; back it up while it is live")
        say(aiworker("db", "upgrade"))
        say(
            aiworker(
                "db", "backup", "--to", str(DEMO / ("backup.dump" if database else "backup.db"))
            )
        )

        step(
            "Poll: issue #1 is assigned to worker-bot by alice (write), so it becomes a task; "
            "the next poll reads only what changed since (and judges again the issues of the "
            "newest second it saw, since timestamps count whole seconds)"
        )
        say(aiworker("poll"))
        say(aiworker("poll"))

        step("Scheduler tick: claims the task and starts `aiworker implement` on a slot")
        say(aiworker("scheduler", "tick"))
        wait_for_state("implemented")

        step("Each job that made progress asks for the next check: publish, CI, review, merge")
        for reached in DELIVERY[1:]:
            wait_for_state(reached)
            say(f"task 1 reached {reached}")
        say((DEMO / "state" / "logs" / "task-1.log").read_text())
        show_delivery(url, tokens["worker-bot"])

        step("The task's whole history")
        say(aiworker("task", "show", "1"))

        run_plan_scenario(DEMO, aiworker, step, say, url, tokens)

        step("Status and doctor")
        say(aiworker("status"))
        say(aiworker("doctor"))
        if database:
            say("(the restore round trip is SQLite's; PostgreSQL restores with pg_restore)")
        else:
            restore_round_trip()
    finally:
        os.kill(pid, signal.SIGTERM)  # SIGINT is ignored where make ran in the background
    say(
        f"\nDone. State is in {DEMO / 'state'}, the forge in {DEMO / 'forge'}; rerun "
        "`make demo` to start afresh; `aiworker task show 1` (with the demo's --config and "
        "--state-dir) tells the task's story."
    )


def restore_round_trip() -> None:
    step(
        "Back up the database with its artifacts, restore both into an empty state "
        "directory and check every task against the forge"
    )
    backup = [str(DEMO / "backup-full.db"), str(DEMO / "backup-artifacts")]
    say(aiworker("db", "backup", "--to", backup[0], "--with-artifacts", backup[1]))
    say(aiworker("restore", "--from", backup[0], "--artifacts", backup[1], state="restored"))
    before = json.loads(aiworker("--json", "status"))
    after = json.loads(aiworker("--json", "status", state="restored"))
    kept = ("payloads", "bytes")
    if before["tasks"] != after["tasks"] or [before["artifacts"][k] for k in kept] != [
        after["artifacts"][k] for k in kept
    ]:
        raise SystemExit(f"demo: the restored state differs: {before} != {after}")
    say(f"the restored state holds the same tasks and {after['artifacts']['payloads']} payloads")


if __name__ == "__main__":
    main()
