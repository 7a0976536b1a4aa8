"""Repository checks (`./ci/run` of the gate and `aiworker ci`) inside a guest: the
runner core materialises and verifies the source on the host as always, then the tree
goes into a fresh guest and the command runs there as the unprivileged user, through
the same run_job (timeouts, cancellation, bounded output, secrets masked) as on the
host, by way of the SSH helper."""

from __future__ import annotations

import json
import shlex
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from aiworker.runtime.execution import EventSink, Limits, Outcome, run_job
from aiworker.runtime.guests.backend import GuestSettings, QemuBackend, as_dev, proxy_env
from aiworker.runtime.guests.egress import EgressPolicy
from aiworker.runtime.guests.images import Image, ImageStore
from aiworker.runtime.workspace import moved

SOURCE = "/home/dev/src"
HOME = "/home/dev/checkhome"


class GuestChecks:
    def __init__(
        self,
        store: ImageStore,
        image: Image | None,
        settings: GuestSettings,
        policy: EgressPolicy,
        unavailable: str | None = None,
    ) -> None:
        self.backend = QemuBackend(store, image, "ci", policy, settings, unavailable)

    def describe(self) -> dict[str, str]:
        return self.backend.describe()

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
        """ARGV as a host job would run in CWD (inside WORKSPACE), but in a guest."""
        session = self.backend.start_guest("ci")
        try:
            shell = session.shell
            shell.put_tree(workspace, SOURCE)
            shell.check(f"install -d -o dev -g dev -m 0700 {HOME} {HOME}/tmp")  # noqa: S108
            places = {str(workspace): SOURCE, str(home): HOME}

            def inside(value: str) -> str:
                return moved(value, places)

            guest_env = {**proxy_env(HOME), **{k: inside(v) for k, v in env.items() if k != "PATH"}}
            spec = {
                "port": session.guest.port,
                "host_key": self.backend.image.host_key,
                "client_key": str(self.backend.image.client_key),
                "command": as_dev(shlex.join(inside(a) for a in argv), guest_env, inside(str(cwd))),
            }
            spec_path = home / "remote.json"
            spec_path.write_text(json.dumps(spec))
            spec_path.chmod(0o600)
            local_env = {"PATH": "/usr/bin:/bin", tag.split("=", 1)[0]: tag.split("=", 1)[1]}
            return run_job(
                [sys.executable, "-m", "aiworker.guest_exec", str(spec_path)],
                cwd=cwd,
                env=local_env,
                limits=limits,
                tag=tag,
                secrets=secrets,
                on_event=on_event,
                cancel=cancel,
            )
        finally:
            session.guest.stop()
            session.proxy.close()
