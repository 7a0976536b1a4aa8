"""The `script` provider's process: apply a scenario's edits in the workspace, commit them,
and print the scenario's result document, exactly where a model's CLI would work.

Usage: python -m aiworker.script_agent SCENARIO [PHASE]
A scenario may hold per-phase variants under "phases" (e.g. "review": {...}); a list of
variants is played in order, one per run of that phase for the task (counted from the
earlier attempts the host lists in continuation.json), the last one repeating; a variant
{"by_milestone": {"1": {...}, "2": {...}}} is chosen by the milestone being done.
A scenario "failure" makes it stop after committing, with that failure's message; a
"probe" (a list of paths) commits probe.json with what reading each of them gave.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

READ_ONLY = ("review", "planning")  # phases given a checkout they may not change
WORK_KEYS = ("edits", "keep_inputs", "probe")  # what a scenario's own keys commit
MESSAGES = {
    "quota_exhausted": "You've hit your usage limit (scripted).",
    "auth": "401 Unauthorized (scripted).",
    "transient": "503 overloaded (scripted).",
    "invalid": "malformed response (scripted).",
}


def main() -> int:
    phase = sys.argv[2] if len(sys.argv) > 2 else "implementation"
    scenario = _variant(json.loads(Path(sys.argv[1]).read_text()), phase)
    edits = dict(scenario.get("edits") or {})
    # A scenario may keep what the phase was handed (its inputs) in the commit, so a
    # rehearsal shows exactly that.
    keep = scenario.get("keep_inputs")
    if keep and (Path(keep).is_absolute() or ".." in Path(keep).parts):
        sys.stderr.write(f"scenario keep_inputs {keep!r} leaves the workspace\n")
        return 2
    if keep:
        inputs = Path("..", "aiworker")  # the workspace's inputs beside the repository
        for path in sorted(p for p in inputs.rglob("*") if p.is_file()):
            target = Path(keep, path.relative_to(inputs))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
            edits[str(target)] = None
    edits.update(_probe(scenario.get("probe") or []))
    for name, text in edits.items():
        if text is None:
            continue  # kept inputs, already written
        path = Path(name)
        if path.is_absolute() or ".." in path.parts:
            sys.stderr.write(f"scenario edit {name!r} leaves the workspace\n")
            return 2
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if edits:
        identity = ["-c", "user.name=aiworker script", "-c", "user.email=script@aiworker.invalid"]
        subprocess.run(["git", "add", "-A", "--", *edits], check=True)
    # Edits that change nothing commit nothing, as an agent that changed nothing does.
    if edits and subprocess.run(["git", "diff", "--cached", "--quiet"], check=False).returncode:
        subprocess.run(
            [
                "git",
                *identity,
                "commit",
                "-q",
                "-m",
                scenario.get("commit_message", "Apply scripted changes"),
            ],
            check=True,
        )
    # A CLI keeps its login in its home; scenarios can rehearse that (and a noisy stderr).
    home = Path(os.environ.get("HOME", "."))
    for name, text in (scenario.get("home_files") or {}).items():
        (home / Path(name).name).write_text(text)
    if scenario.get("stderr"):
        sys.stderr.write(str(scenario["stderr"]) + "\n")
    # A scenario may take its time, as a model does (cancellation and crash tests).
    time.sleep(float(scenario.get("sleep_s") or 0))
    failure = scenario.get("failure")
    if failure:
        sys.stderr.write(MESSAGES.get(failure, str(failure)) + "\n")
        return 1
    sys.stdout.write(json.dumps({"type": "result", "result": scenario.get("result")}) + "\n")
    return 0


def _variant(scenario: dict[str, Any], phase: str) -> dict[str, Any]:
    """What this run of PHASE plays: the phase's own variant (in order, or by milestone),
    else the scenario itself."""
    variants = scenario.get("phases") or {}
    if phase in READ_ONLY and phase not in variants:
        # The scenario's own edits are the work's: a review or a plan changes nothing
        # unless its own variant says so (to rehearse one that tries).
        scenario = {k: v for k, v in scenario.items() if k not in WORK_KEYS}
    scenario = variants.get(phase, scenario)
    if isinstance(scenario, list):
        scenario = scenario[min(_earlier_runs(phase), len(scenario) - 1)]
    if "by_milestone" in scenario:
        scenario = scenario["by_milestone"][str(_milestone())]
    return scenario


def _probe(paths: list[str]) -> dict[str, None]:
    """Rehearses a hostile agent: tries to read each of PATHS, and probe.json (committed
    with the edits) says what it got."""
    if not paths:
        return {}
    Path("probe.json").write_text(json.dumps({p: _try_read(p) for p in paths}, indent=1))
    return {"probe.json": None}


def _try_read(path: str) -> str:
    """What reading PATH gave: its text, or why it could not be read."""
    try:
        target = Path(path)
        if target.is_dir():
            return "directory: " + ", ".join(sorted(p.name for p in target.iterdir()))
        return "read: " + target.read_text(errors="replace")
    except OSError as exc:
        return f"refused: {exc.strerror}"


def _milestone() -> int | None:
    """Which milestone of its plan the phase is doing (context.json), if any."""
    try:
        context = json.loads(Path("..", "aiworker", "context.json").read_text())
    except (OSError, ValueError):
        return None
    return (context.get("milestone") or {}).get("position")


def _earlier_runs(phase: str) -> int:
    """How many attempts of PHASE the host says came before this one."""
    try:
        document = json.loads(Path("..", "aiworker", "continuation.json").read_text())
    except (OSError, ValueError):
        return 0
    return sum(1 for a in document.get("attempts", []) if a.get("phase") == phase)


if __name__ == "__main__":
    sys.exit(main())
