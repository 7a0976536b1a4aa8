"""The systemd user units that run aiworker: scheduler timer, slot jobs, web service."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from aiworker.runtime.atomic import write_private_file

NEXT_STEPS = (
    "aiworker config set scheduler.launcher systemd",
    "systemctl --user daemon-reload",
    "systemctl --user enable --now aiworker-scheduler.timer",
)
UNITS = (
    "aiworker-scheduler.service",
    "aiworker-scheduler.timer",
    "aiworker-slot@.service",
    "aiworker-web.service",
)


def render_units(config_path: Path, state_dir: Path, interval: int) -> dict[str, str]:
    command = f"{shlex.quote(sys.executable)} -m aiworker"
    environment = (
        f"Environment=AIWORKER_CONFIG={shlex.quote(str(config_path))}\n"
        f"Environment=AIWORKER_STATE_DIR={shlex.quote(str(state_dir))}\n"
    )
    return {
        "aiworker-scheduler.service": (
            "[Unit]\nDescription=aiworker scheduler tick\n\n"
            "[Service]\nType=oneshot\n"
            f"{environment}"
            f"ExecStart={command} scheduler tick\n"
            "# 75: temporarily unavailable (a lock is held, maintenance); not a failure.\n"
            "SuccessExitStatus=75\n"
            "TimeoutStartSec=600\nTimeoutStopSec=30\nKillMode=control-group\n"
        ),
        "aiworker-scheduler.timer": (
            "[Unit]\nDescription=Run the aiworker scheduler every "
            f"{interval} seconds\n\n"
            f"[Timer]\nOnBootSec=60s\nOnUnitInactiveSec={interval}s\nAccuracySec=5s\n\n"
            "[Install]\nWantedBy=timers.target\n"
        ),
        "aiworker-slot@.service": (
            "[Unit]\nDescription=aiworker slot %i job\n\n"
            "[Service]\nType=exec\n"
            f"{environment}"
            f"ExecStart={command} scheduler run-slot %i\n"
            "SuccessExitStatus=75\n"
            "TimeoutStopSec=120\nKillMode=control-group\n"
        ),
        "aiworker-web.service": (
            "[Unit]\nDescription=aiworker web control plane (loopback)\n\n"
            "[Service]\nType=exec\n"
            f"{environment}"
            f"ExecStart={command} web serve\n"
            "Restart=on-failure\nTimeoutStopSec=30\nKillMode=control-group\n\n"
            "[Install]\nWantedBy=default.target\n"
        ),
    }


def user_unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def install_units(target: Path, config_path: Path, state_dir: Path, interval: int) -> list[Path]:
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_units(config_path, state_dir, interval).items():
        path = target / name
        write_private_file(path, text.encode())
        os.chmod(path, 0o644)
        written.append(path)
    return written
