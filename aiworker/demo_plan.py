"""`make demo`'s second scenario: a plan issue through approval, two milestones on one
branch, one PR, a review that requests changes, a repair episode, a fresh review and the
merge, each step printed as the task records it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CALC_SUB = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
CALC_MUL = CALC_SUB + "\n\ndef mul(a, b):\n    return a * b\n"


def _test(name: str, cases: list[str]) -> str:
    body = "".join(f"        self.assertEqual({case})\n" for case in cases)
    return (
        f"import unittest\n\nfrom calc import {name}\n\n\n"
        f"class {name.title()}Test(unittest.TestCase):\n    def test_{name}(self):\n{body}"
    )


def _result(summary: str, **extra: Any) -> dict[str, Any]:
    return {
        "contract": "ait.agent.result.v1",
        "completion": "complete",
        "summary": summary,
        **extra,
    }


MILESTONES = [
    {
        "title": "Add sub()",
        "scope": "calc.sub(a, b) returns a - b, with a test.",
        "acceptance_criteria": ["sub(5, 3) == 2"],
        "validation": [{"check_id": "unit", "command": ["./ci/run"]}],
    },
    {
        "title": "Add mul()",
        "scope": "calc.mul(a, b) returns a * b, with a test.",
        "acceptance_criteria": ["mul(2, 3) == 6"],
        "simple": True,
    },
]
SCENARIO = {
    "phases": {
        "planning": {"result": _result("Two small steps", milestones=MILESTONES)},
        "implementation": {
            "by_milestone": {
                "1": {
                    "edits": {"calc.py": CALC_SUB, "test_sub.py": _test("sub", ["sub(5, 3), 2"])},
                    "commit_message": "Add sub()",
                    "result": _result("sub() added with a test"),
                },
                "2": {
                    "edits": {"calc.py": CALC_MUL, "test_mul.py": _test("mul", ["mul(2, 3), 6"])},
                    "commit_message": "Add mul()",
                    "result": _result("mul() added with a test"),
                },
            }
        },
        "review": [
            {
                "result": _result(
                    "mul() needs a negative case",
                    findings=[
                        {
                            "severity": "major",
                            "message": "test mul() with a negative operand",
                            "path": "test_mul.py",
                        }
                    ],
                )
            },
            {"result": _result("sub() and mul() are right and tested.")},
        ],
        "repair": {
            "edits": {"test_mul.py": _test("mul", ["mul(2, 3), 6", "mul(-2, 3), -6"])},
            "commit_message": "Test mul() with a negative operand",
            "result": _result("Added the negative case the review asked for"),
        },
    }
}


SEEN: set[int] = set()  # the transitions printed already


def follow(
    state_dir: Path, task_id: int, until: str, say: Callable[[str], None], timeout: float = 180
) -> None:
    """Print every new transition of the plan and its milestones until the plan reaches
    UNTIL."""
    from aiworker.store.engine import Database, default_url
    from aiworker.store.task_records import children_of, events_of_tasks, task_row

    db = Database(os.environ.get("AIWORKER_DEMO_DATABASE_URL") or default_url(state_dir))
    seen = SEEN
    started = time.monotonic()
    try:
        while time.monotonic() - started < timeout:
            with db.read() as session:
                plan = task_row(session, task_id)
                ids = [task_id, *(c.id for c in children_of(session, task_id))]
                events = [e for e in events_of_tasks(session, ids) if e.to_state]
                kinds = {i: task_row(session, i).kind for i in ids}  # type: ignore[union-attr]
            for event in events:
                if event.id in seen or event.from_state == event.to_state:
                    continue
                seen.add(event.id)
                reason = str((event.data or {}).get("reason", ""))[:110]
                say(
                    f"  task {event.task_id} ({kinds.get(event.task_id or 0, '?')}): "
                    f"{event.from_state or '-'} -> {event.to_state}  {reason}"
                )
            if plan is not None and plan.state == until:
                return
            if plan is not None and plan.state in ("failed", "cancelled", "needs_input"):
                raise SystemExit(f"the plan is {plan.state}; see `aiworker task show {task_id}`")
            time.sleep(0.1)
    finally:
        db.dispose()
    raise SystemExit(f"the plan did not reach {until}; see .demo/state/logs/")


def run_plan_scenario(
    demo: Path,
    aiworker: Callable[..., str],
    step: Callable[[str], None],
    say: Callable[[str], None],
    url: str,
    tokens: dict[str, str],
) -> None:
    from aiworker.adapters.forgejo import ForgejoClient

    alice = ForgejoClient(url, tokens["alice"])
    state = demo / "state"
    step("Second scenario: alice labels issue #2 `aiworker-plan`; the planner proposes a plan")
    scenario = demo / "plan-scenario.json"
    scenario.write_text(json.dumps(SCENARIO, indent=2))
    aiworker("config", "set", "provider_options.script.scenario", str(scenario))
    alice.add_labels("team", "app", 2, ["aiworker-plan"])
    say(aiworker("poll"))
    say(aiworker("scheduler", "tick"))
    follow(state, 2, "awaiting_plan_approval", say)
    plan = [c for c in alice.comments("team", "app", 2) if c.user.login == "planner-bot"][-1]
    say("the plan, as posted on issue #2 by planner-bot:\n" + plan.body.rsplit("\n", 1)[0])

    step("Nothing runs before a writer approves: the read-only user's approval is ignored")
    ForgejoClient(url, tokens["reader"]).create_comment("team", "app", 2, "/aiworker approve")
    # The tick may be running this same step; the command waits for it.
    say(aiworker("milestones", "--task", "2", wait_for_lock=True))

    step(
        "alice approves with the label: two milestones run in order on one branch, then one "
        "PR; the review asks for changes, a repair episode answers, a fresh review approves"
    )
    alice.add_labels("team", "app", 2, ["aiworker-approved"])
    say(aiworker("scheduler", "tick"))
    follow(state, 2, "done", say)
    [pull] = [p for p in alice.pulls("team", "app", state="all") if "task=2 " in p.body]
    say(f"PR #{pull.number} '{pull.title}': merged={pull.merged}")
    for review in alice.reviews("team", "app", pull.number):
        login = review.user.login if review.user else "?"
        say(f"review by {login}: {review.state} on {review.commit_id}")
    say("PR body:\n" + pull.body)
