"""The success keys of every command's `--json` document, pinned: a renamed or dropped key
breaks the scripts that read it, so changing one is a deliberate edit here."""

from __future__ import annotations

from typing import Any

IMPLEMENT_KEYS = frozenset(
    {"task", "outcome", "provider", "attempt", "base", "head", "gate", "reason"}
    | {"decisions", "state"}
)
KEYS: dict[str, frozenset[str] | str] = {
    "status": frozenset(
        {"tasks", "total_tasks", "slots", "last_check", "poll_error", "poll_failures", "isolation"}
        | {"scheduler", "artifacts", "controller", "controllers", "low_space", "held"}
    ),
    "doctor": frozenset({"ok", "checks"}),
    "poll": frozenset({"repositories", "tasks", "unauthorized", "paused", "polls"}),
    "claim": frozenset({"claimed", "slot", "task", "holder", "reason", "recovered"}),
    "implement": IMPLEMENT_KEYS,
    "repair": IMPLEMENT_KEYS,
    "plan": IMPLEMENT_KEYS | {"milestones"},
    "milestones": frozenset({"task", "state", "approval", "accepted", "started", "reason"}),
    "publish": frozenset({"task", "pr", "branch", "head", "created", "state"}),
    "ci": frozenset({"task", "pr", "head", "state", "check", "evidence", "receipt", "receipt_url"}),
    "review": frozenset({"task", "pr", "event", "review", "provider", "reason", "findings"})
    | {"state"},
    "merge": frozenset({"task", "pr", "head", "merge_commit", "merged_at", "merged_by", "state"}),
    "cleanup": frozenset({"removed", "skipped", "changed", "kept"}),
    "retention": frozenset(
        {"dry_run", "removed", "refs", "files", "freed_bytes", "payloads", "bytes", "changed"}
    ),
    "config show": frozenset({"path", "exists", "revision", "config", "tokens"}),
    "config validate": frozenset({"path", "exists", "valid"}),
    "config set": frozenset({"path", "key", "revision", "previous"}),
    "db upgrade": frozenset({"database", "before", "current", "head", "up_to_date"}),
    "db current": frozenset({"database", "before", "current", "head", "up_to_date"}),
    "db backup": frozenset({"source", "target", "bytes", "revision", "artifacts"}),
    "db copy": frozenset({"source", "target", "revision", "rows"}),
    "scheduler tick": frozenset(
        {"status", "poll", "poll_error", "recovered", "started", "busy_slots", "delivering"}
        | {"skipped", "cleaned", "guests_swept", "next_deadline", "low_space"}
        | {"expired", "stuck", "retention"}
    ),
    "scheduler pause": frozenset(
        {"paused", "reason", "paused_by", "paused_at", "already", "pending"}
    ),
    "scheduler resume": frozenset({"paused"}),
    "scheduler start-now": frozenset({"requested", "via", "pid", "paused"}),
    "scheduler status": frozenset(
        {"paused", "paused_reason", "last_check", "next_deadline", "check_requested", "slots"}
        | {"poll_error", "poll_failures"}
    ),
    "scheduler run-slot": "becomes the slot's phase command (exec): that command's document",
    "scheduler run-step": "becomes the step's command (exec): that command's document",
    "scheduler install": frozenset({"written", "next_steps", "notes"}),
    "runner schema": "a JSON Schema document (the contract itself)",
    "runner execute": "an ait.runner.native-result.v1 document (tests/test_runner_execute.py)",
    "runner serve": frozenset({"worker_id", "contract", "jobs"}),
    "runner run-job": frozenset({"worker_id", "contract", "jobs"}),
    "runner doctor": frozenset({"ok", "checks"}),
    "qemu provision": frozenset(
        {"image", "path", "accel", "accel_reason", "build_s", "cold_boot_s", "saved_state"}
        | {"previous", "removed", "files"}
    ),
    "qemu layer": frozenset({"image", "layer", "build_s", "script_sha256"}),
    "qemu list": frozenset({"backend", "backend_reason", "current", "images", "guests", "swept"}),
    "qemu boot": frozenset({"name", "image", "port", "restored", "seconds"}),
    "qemu ssh": "the command's own output and exit code, or an interactive shell",
    "qemu stop": frozenset({"name", "stopped"}),
    "sandbox serve": "serves until interrupted; prints its address, no document",
    "web serve": "serves until interrupted; prints its address, no document",
    "sandbox seed": frozenset({"users", "repositories"}),
    "providers status": frozenset({"suspended", "phases", "providers"}),
    "providers check": frozenset({"suspended", "phases", "providers"}),
    "task list": frozenset({"tasks", "next_after"}),
    "task show": frozenset(
        {"id", "kind", "repository", "issue", "title", "state", "version", "parent"}
        | {"scope_fingerprint", "base", "head", "claim", "budgets", "history", "attempts"}
        | {"receipts", "publications", "files"}
    ),
    "task retry": frozenset({"task", "state", "budget_reset"}),
    "task resume": frozenset({"task", "state", "was"}),
    "restore": frozenset(
        {"state_dir", "restored_from", "revision", "artifacts", "recovered", "tasks"}
    ),
    "task cancel": frozenset(
        {"task", "state", "was", "stopped", "attempts_closed", "removed", "pr_comment", "pr_merged"}
    ),
}


def assert_keys(command: str, document: Any) -> None:
    expected = KEYS[command]
    assert isinstance(expected, frozenset), f"{command} has no pinned keys"
    assert isinstance(document, dict), f"{command}: {document!r}"
    assert set(document) == expected, (
        f"{command}: extra {sorted(set(document) - expected)}, "
        f"missing {sorted(expected - set(document))}"
    )
