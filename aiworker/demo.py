"""`make demo`: run what aiworker can do today, end to end, on embedded defaults.

Every step is a real `aiworker` command in a fresh process against a private
state directory under .demo/; the demo narrates what each one did.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from aiworker.runtime.processes import run_command

DEMO = Path(".demo").absolute()


def aiworker(*args: str) -> str:
    argv = [sys.executable, "-m", "aiworker", "--state-dir", str(DEMO / "state")]
    argv += ["--config", str(DEMO / "config.toml"), *args]
    result = run_command(argv, timeout=120)
    if not result.ok:
        sys.stderr.write(result.stderr)
        raise SystemExit(f"demo step failed: aiworker {' '.join(args)} (exit {result.returncode})")
    return result.stdout


def step(title: str) -> None:
    sys.stdout.write(f"\n== {title}\n")


def main() -> None:
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    step("Write a configuration (2 slots, the script provider) with `config set`")
    aiworker("config", "set", "shares", "2")
    changed = json.loads(aiworker("--json", "config", "set", "providers", '["script"]'))
    sys.stdout.write(f"{DEMO / 'config.toml'} at revision {changed['revision'][:12]}\n")
    sys.stdout.write(aiworker("config", "validate"))

    step("Create the database and migrate it to the current schema")
    sys.stdout.write(aiworker("db", "upgrade"))
    sys.stdout.write(aiworker("db", "upgrade"))

    step("Back up the live database to a new private file")
    sys.stdout.write(aiworker("db", "backup", "--to", str(DEMO / "backup.db")))

    step("Status: tasks by state and the slots")
    sys.stdout.write(aiworker("status"))

    step("Doctor: what this machine can run")
    sys.stdout.write(aiworker("doctor"))

    sys.stdout.write(
        f"\nDone. State is in {DEMO / 'state'}; rerun `make demo` to start afresh.\n"
        "Polling the forge, claiming and the delivery loop join this demo as they land.\n"
    )


if __name__ == "__main__":
    main()
