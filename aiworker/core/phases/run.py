"""Running a provider's command in a workspace and reading what it returned."""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiworker.adapters.providers.base import RunRequest
from aiworker.config.limits import RUN_LIMIT_S
from aiworker.runtime.execution import Limits, Outcome, run_job
from aiworker.runtime.workspace import (
    ExecutionBackend,
    LocalBackend,
    Workspace,
    moved,
    translated,
)

log = logging.getLogger(__name__)
# The final result event sits at the end of the stream; keep enough of it to parse.
OUTPUT_TAIL = 4 * 1024 * 1024
# The end of each stream kept with the attempt (masked) for the operator.
KEPT_TAIL = 16 * 1024
CUT_MARGIN = 8 * 1024  # longer than any credential the masks look for


@dataclass(frozen=True)
class Bound:
    seconds: float
    cancel: threading.Event


@dataclass
class RunReport:
    result: dict[str, Any] | None
    failure: str | None
    reason: str
    # What the provider printed (the ends of its streams), kept masked with the attempt.
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False  # ended by its time limit (or its gate)


def run_provider(
    provider: Any,
    workspace: Workspace,
    model: str | None,
    effort: str | None,
    attempt_tag: str,
    phase: str = "implementation",
    backend: ExecutionBackend | None = None,
    hidden: list[Path] | None = None,
    bound: Bound | None = None,
    timeout_s: float = RUN_LIMIT_S,
) -> RunReport:
    """Run PROVIDER's command in WORKSPACE for at most TIMEOUT_S (its phase's limit within
    the task's deadline). BOUND (a local model's try): its wall time, and the event its
    gate sets to end the try at a bound."""
    if bound is not None:
        timeout_s = min(timeout_s, bound.seconds)
    backend = backend or LocalBackend()
    prompt = (workspace.inputs / "prompt.md").read_text()
    schema = workspace.inputs / "result-schema.json"
    spec = provider.command(RunRequest(phase, model, effort, workspace.repo, schema, prompt))
    tag = f"AIWORKER_ATTEMPT_ID={attempt_tag}"
    stdin_path = None
    if spec.stdin is not None:
        stdin_path = workspace.inputs / "stdin"
        stdin_path.write_bytes(spec.stdin)
    # The provider's own homes (HOME, CODEX_HOME, CLAUDE_CONFIG_DIR, ...) are lent to this
    # run only: a private copy (a tmpfs in a guest), refreshed logins adopted back after.
    homes = [Path(v) for k, v in spec.env.items() if k.endswith(("HOME", "_DIR")) and v]
    leased = backend.open_home(workspace, homes)
    env = {**translated(spec.env, leased), "AIWORKER_ATTEMPT_ID": attempt_tag}
    # Other providers' homes (their credentials) are not even visible: file modes do not
    # separate jobs that run as the same user.
    argv, env = backend.command([moved(a, leased) for a in spec.argv], env, workspace, hidden or [])
    try:
        outcome = run_job(
            argv,
            cwd=workspace.repo,
            env=env,
            tag=tag,
            stdin_path=stdin_path,
            limits=Limits(timeout_s=timeout_s, tail_bytes=OUTPUT_TAIL),
            cancel=bound.cancel if bound else None,
        )
    finally:
        try:
            backend.close_home(workspace)
        except Exception:  # the run's own outcome matters more; teardown tries again
            log.exception("taking the provider's home back failed")
    stdout, stderr = outcome.stdout.tail, outcome.stderr.tail
    # A margin more than is kept: masked first and cut after, a secret the cut splits
    # lies in the part that is dropped.
    printed = (stdout[-KEPT_TAIL - CUT_MARGIN :], stderr[-KEPT_TAIL - CUT_MARGIN :])
    if outcome.timed_out:
        why = f"the provider run timed out after {timeout_s:.0f} s"
        return RunReport(None, "transient", why, *printed, timed_out=True)
    parsed = provider.parse(stdout, outcome.exit_code if outcome.exit_code is not None else -1)
    if (parsed.error is not None or parsed.result is None) and _killed(outcome):
        # Not the provider's failure nor the work's: another try may well finish.
        why = (
            "the provider was killed by SIGKILL from outside aiworker (the kernel's "
            "out-of-memory killer, or a person on this host)"
        )
        return RunReport(None, "transient", why, *printed)
    if parsed.error is not None or parsed.result is None:
        message = f"{parsed.error or ''} {stderr.decode(errors='replace')[-2000:]}"
        why = (parsed.error or "no result")[:300]
        return RunReport(None, provider.classify(message), why, *printed)
    budget = getattr(provider, "diff_budget_lines", None)
    if budget:
        changed = backend.changed_lines(workspace)
        if changed > budget:
            return RunReport(
                None,
                "over_budget",
                f"{provider.name} changed {changed} lines, over its budget of {budget}",
                *printed,
            )
    return RunReport(parsed.result, None, "", *printed)


def _killed(outcome: Outcome) -> bool:
    """Whether the run was killed by a SIGKILL aiworker did not send: the process itself,
    or (137, as a shell or bubblewrap reports it) the one it ran. What aiworker killed
    after it ended (a child left holding its output) is not why it ended."""
    by_us = outcome.signalled_running
    return not by_us and (outcome.signal == "SIGKILL" or outcome.exit_code == 128 + signal.SIGKILL)
