"""The systemd user units that run aiworker: the scheduler timer and tick, and slot jobs.

The units are files (contrib/systemd/ in a checkout, aiworker/_systemd inside a
wheel) with @NAME@ placeholders; `scheduler install` fills in this installation's
interpreter, configuration, state directory and interval. A tick that runs inside a
systemd service must start its jobs as their own units: with the direct launcher
they would sit in the tick's cgroup and die with it (KillMode=control-group).
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from aiworker.config.origins import http_origin
from aiworker.core.report import Report
from aiworker.errors import InvalidInput
from aiworker.runtime.atomic import private_directory, write_private_file
from aiworker.runtime.cgroups import own_cgroup
from aiworker.runtime.listen import is_loopback, parse_listen

UNITS = (
    "aiworker-scheduler.service",
    "aiworker-scheduler.timer",
    "aiworker-slot@.service",
    "aiworker-step@.service",
)
WEB_UNIT = "aiworker-web.service"  # written only when asked (install --web ADDRESS:PORT)
RUNNER_UNIT = "aiworker-runner.service"  # only when asked (install --runner-server URL)
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")


def template_dir() -> Path:
    """Inside a wheel the units ship as aiworker/_systemd; in a checkout, in contrib/."""
    package = Path(__file__).resolve().parents[2]
    packaged = package / "_systemd"
    return packaged if packaged.is_dir() else package.parent / "contrib" / "systemd"


def escape(value: str, what: str) -> str:
    """VALUE for a quoted word of a unit file, with systemd's `%` specifiers escaped."""
    if _UNSAFE.search(value):
        raise InvalidInput(f"{what} {value!r} contains a control character; systemd cannot use it")
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")


def render_units(
    config_path: Path,
    state_dir: Path,
    interval: int,
    homes: list[Path] | None = None,
    web: str | None = None,
    runner_server: str | None = None,
) -> dict[str, str]:
    """The units with this installation's values; HOMES (provider homes, a SQLite
    database's folder, the guests' folder outside the state directory) are writable too;
    WEB (a loopback ADDRESS:PORT) adds the web unit, RUNNER_SERVER (the controller's
    runner API) the runner's."""
    outside = [h for h in homes or [] if h != state_dir and state_dir not in h.parents]
    writable = [state_dir, *dict.fromkeys(outside)]
    values = {
        # ExecStart= also expands $VAR: a literal $ is written $$ there (only there).
        "PYTHON": escape(sys.executable, "the interpreter path").replace("$", "$$"),
        "CONFIG": escape(str(config_path), "the configuration path"),
        "STATE_DIR": escape(str(state_dir), "the state directory"),
        "WRITABLE": " ".join(f'"{escape(str(p), "a writable path")}"' for p in writable),
        "INTERVAL": str(int(interval)),
        "CONFIG_DIR": escape(str(config_path.parent), "the configuration's folder"),
        "LISTEN": escape(web or "", "the web address"),
        "SERVER": escape(runner_server or "", "the runner server"),
        "WORKER_ID": escape(os.uname().nodename or "runner", "the host name"),
        "ATTEMPT_ROOT": escape(str(state_dir / "runner-attempts"), "the attempt root"),
    }
    # The runner's ExecStart= names its attempt root, which ReadWritePaths= names too:
    # systemd expands $ in the one and not in the other, so no escape serves both.
    for key in ("ATTEMPT_ROOT", "SERVER", "WORKER_ID") if runner_server else ():
        if "$" in values[key]:
            raise InvalidInput(
                f"{values[key]}: the runner's unit cannot hold a $ there (systemd would "
                "expand it in the command line alone); use a path or name without one"
            )
    rendered = {}
    names = [*UNITS, *([WEB_UNIT] if web else []), *([RUNNER_UNIT] if runner_server else [])]
    for name in names:
        text = (template_dir() / name).read_text()
        for key, value in values.items():
            text = text.replace(f"@{key}@", value)
        leftover = re.search(r"@[A-Z_]+@", text)
        if leftover:
            raise RuntimeError(f"{name}: placeholder {leftover.group()} was not filled in")
        rendered[name] = text
    return rendered


def user_unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def install_units(
    target: Path,
    config_path: Path,
    state_dir: Path,
    interval: int,
    homes: list[Path],
    web: str | None = None,
    runner_server: str | None = None,
    places: list[Path] | None = None,
) -> list[Path]:
    if web is not None and not is_loopback(parse_listen(web, "--web")[0]):
        raise InvalidInput(f"--web {web}: the web unit listens on a loopback address only")
    if runner_server is not None:
        runner_server = http_origin(runner_server, "--runner-server")
    places = places or []
    if target.exists() and not target.is_dir():  # refused before anything is made
        raise InvalidInput(f"--dir {target}: exists and is not a directory")
    units = render_units(config_path, state_dir, interval, [*homes, *places], web, runner_server)
    target.mkdir(parents=True, exist_ok=True)  # where they go first: refused, nothing made
    # Every path a unit makes writable must exist when it starts (else 226/NAMESPACE).
    for home in [state_dir, *homes]:
        private_directory(home)
    for place in places:  # made if missing; one that exists may be shared: left as it is
        place.mkdir(mode=0o700, parents=True, exist_ok=True)
    if web is not None or runner_server is not None:  # they name the configuration's folder
        config_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if runner_server is not None:
        private_directory(state_dir / "runner-attempts")
    written = []
    for name, text in units.items():
        path = target / name
        write_private_file(path, text.encode())
        os.chmod(path, 0o644)
        written.append(path)
    return written


@dataclass
class InstallReport(Report):
    written: list[str]
    next_steps: list[str]  # commands, exact for this installation, to run in order
    notes: list[str] = field(default_factory=list)


def next_steps(
    config_path: Path,
    state_dir: Path,
    written: list[Path],
    user_dir: bool,
    token_env: list[tuple[str, str]] | None = None,
    *,
    database_made: bool = True,
) -> InstallReport:
    """What to run after install, as commands that run as printed: the launcher set in the
    configuration the units read, linger so the timer runs without a login, the units
    enabled, and how to see them work (DATABASE_MADE: else `db upgrade` comes first)."""
    aiworker = [sys.executable, "-m", "aiworker", "--config", str(config_path)]
    aiworker += ["--state-dir", str(state_dir)]
    user = getpass.getuser()
    steps = [shlex.join([*aiworker, "config", "set", "scheduler.launcher", "systemd"])]
    steps.append(("" if os.geteuid() == 0 else "sudo ") + f"loginctl enable-linger {user}")
    if not user_dir:
        steps.append(shlex.join(["systemctl", "--user", "link", *map(str, written)]))
    steps.append("systemctl --user daemon-reload")
    names = [p.name for p in written]
    enable = [n for n in names if n.endswith(".timer") or n in (WEB_UNIT, RUNNER_UNIT)]
    steps.append(shlex.join(["systemctl", "--user", "enable", "--now", *enable]))
    steps.append("systemctl --user list-timers aiworker-scheduler.timer")
    steps.append("journalctl --user -u aiworker-scheduler.service -n 20")
    # The units get none of this shell's environment: a token read from a variable
    # (TOKEN_ENV: identity, variable) is missing there. Environment= would show it to
    # anyone who runs `systemctl show`; a file is the way.
    notes = [
        f"the units do not see ${variable}, which {name}'s token is read from: keep it in a "
        f"0600 file instead (config set forge.identities.{name}.token_file PATH)"
        for name, variable in token_env or []
    ]
    if not database_made:
        upgrade = shlex.join([*aiworker, "db", "upgrade"])
        notes.append(f"no database yet: run `{upgrade}` before enabling the timer")
    if RUNNER_UNIT in names:
        env_file = config_path.parent / "runner.env"
        notes.append(
            f"before enabling {RUNNER_UNIT}, put AIWORKER_SERVER_TOKEN=... in {env_file} "
            "(mode 0600)"
        )
    return InstallReport([str(p) for p in written], steps, notes)


def systemd_service() -> str | None:
    """The systemd service this process runs in, or None (a shell, cron, a scope)."""
    leaf = own_cgroup().rsplit("/", 1)[-1]
    if os.environ.get("INVOCATION_ID") and leaf.endswith(".service"):
        return leaf
    return None


def refuse_direct_launch_in_a_service(launcher: str) -> None:
    """Jobs started directly by a tick inside a service share its cgroup and are killed
    when the tick's unit stops: refuse that before anything is claimed."""
    service = systemd_service()
    if launcher == "direct" and service is not None:
        raise InvalidInput(
            f"this tick runs inside the systemd service {service}, where jobs it starts "
            "directly would be killed when the tick ends (KillMode=control-group); set "
            "`aiworker config set scheduler.launcher systemd` so each job runs as "
            "aiworker-slot@N.service"
        )
