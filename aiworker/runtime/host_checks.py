"""Repository checks on this host, inside bubblewrap.

A check runs the repository's `./ci/run`, code an agent may have written, so on the
controller's host it gets what an agent gets there: the system read-only, its own
attempt directory writable, and the host's secrets (the state directory with the
database and keys, the configuration, every token file) and every other attempt
out of sight. The qemu backend runs checks in a guest instead
(runtime/guests/checks.py); both take the place of a plain host run.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aiworker.runtime.bubblewrap import Jail, jailed
from aiworker.runtime.execution import EventSink, Limits, Outcome, run_job


@dataclass(frozen=True)
class SandboxedChecks:
    hidden: list[Path]
    bwrap: str

    def run(
        self,
        workspace: Path,
        home: Path,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: dict[str, str],
        limits: Limits,
        tag: str,
        secrets: Sequence[bytes],
        on_event: EventSink,
        cancel: threading.Event | None,
    ) -> Outcome:
        """ARGV as a host job would run in CWD (inside WORKSPACE), but jailed: only
        WORKSPACE and HOME (the attempt's own) are writable, its siblings are hidden."""
        attempt = workspace.parent
        jail = Jail(
            chdir=cwd,
            tmpdir=home / "tmp",
            empty=attempt / "empty",
            writable=[workspace, home],
            hidden=[*self.hidden, attempt.parent],
        )
        return run_job(
            jailed(list(argv), jail, self.bwrap),
            cwd=cwd,
            env=env,
            limits=limits,
            tag=tag,
            secrets=secrets,
            on_event=on_event,
            cancel=cancel,
        )
