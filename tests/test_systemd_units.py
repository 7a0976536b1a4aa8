"""The systemd units: shipped as files, rendered with this installation's paths, hardened,
checked by systemd's own tools; and a tick inside a service never starts jobs in its
own cgroup."""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from aiworker.runtime.cgroups import cgroup2_mount, own_cgroup
from tests.helpers import run_process

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ("aiworker-scheduler.service", "aiworker-slot@.service", "aiworker-step@.service")
JOBS = ("aiworker-slot@.service", "aiworker-step@.service")
HARDENING = (
    "NoNewPrivileges=yes",
    "PrivateTmp=yes",
    "ProtectSystem=strict",
    "ProtectHome=read-only",
    "UMask=0077",
    "CapabilityBoundingSet=",
    "KillMode=control-group",
)
# systemd-analyze security --offline: exposure 0.0 (locked down) to 10.0 (exposed); the
# units as first written (no hardening) scored 9.6.
MOST_EXPOSURE = {
    "aiworker-scheduler.service": 3.0,
    "aiworker-slot@1.service": 5.0,
    "aiworker-step@1.service": 5.0,
    "aiworker-web.service": 3.0,
    "aiworker-runner.service": 5.0,
}
RUNNER = "aiworker-runner.service"

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze missing"
)


def install(
    target: Path, state_dir: Path | None = None, *extra: str
) -> subprocess.CompletedProcess:
    env = {"AIWORKER_STATE_DIR": str(state_dir)} if state_dir else {}
    return run_process("--json", "scheduler", "install", "--dir", str(target), *extra, env=env)


def analyze(*args: str) -> subprocess.CompletedProcess:
    # A short runtime directory: the user manager's socket paths must fit in 108 bytes.
    with tempfile.TemporaryDirectory(prefix="xdg-", dir="/tmp") as runtime:
        return subprocess.run(
            ["systemd-analyze", *args],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "XDG_RUNTIME_DIR": runtime},
        )


def test_units_are_the_shipped_files_with_this_installations_paths(tmp_path, state_dir):
    target = tmp_path / "units"
    result = install(target)
    assert result.exit_code == 0, result
    written = sorted(p.name for p in target.iterdir())
    shipped = sorted(p.name for p in (ROOT / "contrib" / "systemd").iterdir())
    # The web and runner units are written only when asked for.
    assert written == [n for n in shipped if n not in ("aiworker-web.service", RUNNER)]
    for name in written:
        template = (ROOT / "contrib" / "systemd" / name).read_text()
        pattern = re.escape(template)
        for placeholder in ("PYTHON", "CONFIG", "STATE_DIR", "WRITABLE", "INTERVAL", "LISTEN"):
            pattern = pattern.replace(re.escape(f"@{placeholder}@"), ".+?")
        assert re.fullmatch(pattern, (target / name).read_text(), re.DOTALL), name
    scheduler = (target / "aiworker-scheduler.service").read_text()
    assert f'ExecStart="{sys.executable}" -m aiworker scheduler tick' in scheduler
    assert f'ReadWritePaths="{state_dir}"' in scheduler
    assert f'Environment="AIWORKER_STATE_DIR={state_dir}"' in scheduler
    for name in SERVICES:
        text = (target / name).read_text()
        for setting in HARDENING:
            assert setting in text.splitlines(), f"{name}: {setting}"
        assert re.search(r"^SyslogIdentifier=aiworker-", text, re.MULTILINE), name
    slot = (target / "aiworker-slot@.service").read_text().splitlines()
    assert {"MemoryMax=8G", "TasksMax=4096", "MemorySwapMax=0"} <= set(slot)


def test_every_path_a_unit_names_exists_after_install_and_jobs_reach_kvm(tmp_path):
    # The default configuration: neither the file nor its folder exists yet.
    assert not (tmp_path / "xdg-config" / "aiworker").exists()
    state = tmp_path / "state"
    target = tmp_path / "units"
    result = run_process(
        "--json", "--state-dir", str(state), "scheduler", "install",
        "--dir", str(target), "--web", "127.0.0.1:8765", *FLEET,
    )  # fmt: skip
    assert result.exit_code == 0, result
    for unit in target.iterdir():
        text = unit.read_text()
        for line in text.splitlines():
            if line.startswith("ReadWritePaths="):
                for path in shlex.split(line.split("=", 1)[1]):
                    assert path.startswith("-") or Path(path).is_dir(), (unit.name, path)
                    assert Path(path.lstrip("-")).stat().st_mode & 0o077 == 0, path
        if unit.name in JOBS:
            lines = text.splitlines()
            assert "DeviceAllow=/dev/kvm rw" in lines
            assert "DevicePolicy=closed" in lines
            assert not any(x.startswith("PrivateDevices=") for x in lines), unit.name
        # A user manager has no network-online.target: only the runner, which may be a
        # system unit, names it.
        if unit.name != RUNNER:
            assert "network-online.target" not in text, unit.name


def test_the_printed_next_steps_are_exact_and_the_first_runs_as_printed(tmp_path):
    config = tmp_path / "xdg-config" / "aiworker" / "config.toml"  # the default, not yet written
    state = tmp_path / "state"
    target = tmp_path / "units"
    result = run_process(
        "--json", "--state-dir", str(state), "scheduler", "install",
        "--dir", str(target), "--web", "127.0.0.1:8765",
    )  # fmt: skip
    assert result.exit_code == 0, result
    report = result.json()
    steps = report["next_steps"]
    user = getpass.getuser()
    written = sorted(report["written"])
    assert shlex.split(steps[0]) == [
        sys.executable, "-m", "aiworker", "--config", str(config), "--state-dir", str(state),
        "config", "set", "scheduler.launcher", "systemd",
    ]  # fmt: skip
    linger = f"loginctl enable-linger {user}"
    assert steps[1] == (linger if os.geteuid() == 0 else f"sudo {linger}")
    assert sorted(shlex.split(steps[2])[3:]) == written
    assert shlex.split(steps[2])[:3] == ["systemctl", "--user", "link"]
    assert steps[3] == "systemctl --user daemon-reload"
    assert steps[4] == (
        "systemctl --user enable --now aiworker-scheduler.timer aiworker-web.service"
    )
    assert "list-timers" in steps[5]
    assert steps[6] == "journalctl --user -u aiworker-scheduler.service -n 20"
    # The first step, run exactly as printed, sets the launcher in the file the units read.
    done = subprocess.run(shlex.split(steps[0]), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert 'launcher = "systemd"' in config.read_text()
    # No database yet: a note says how to make it, and that runs as printed too.
    [note] = [n for n in report["notes"] if n.startswith("no database yet: run `")]
    assert note.endswith("` before enabling the timer")
    upgrade = shlex.split(note.split("`")[1])
    done = subprocess.run(upgrade, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (state / "aiworker.db").is_file()
    again = run_process("--json", "--state-dir", str(state), "scheduler", "install",
                        "--dir", str(target))  # fmt: skip
    assert not any(n.startswith("no database yet") for n in again.json()["notes"])
    units = (target / "aiworker-scheduler.service").read_text()
    assert f'Environment="AIWORKER_CONFIG={config}"' in units


def test_a_changed_check_interval_reaches_the_timer_without_reinstalling(
    cli, upgraded, state_dir, tmp_path, monkeypatch
):
    config = tmp_path / "config.toml"
    config.write_text("check_interval = 600\n")
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))
    assert cli("--json", "scheduler", "tick").json()["status"] == "checked"
    # The timer's next wake-up: not due within the interval, so nothing runs.
    assert cli("--json", "scheduler", "tick", "--if-due").json()["status"] == "not_due"
    state = json.loads((state_dir / "scheduler.json").read_text())
    state["last_check"] = (datetime.now(UTC) - timedelta(seconds=30)).isoformat()
    (state_dir / "scheduler.json").write_text(json.dumps(state))
    assert cli("--json", "scheduler", "tick", "--if-due").json()["status"] == "not_due"
    assert cli("config", "set", "check_interval", "20").exit_code == 0
    assert cli("--json", "scheduler", "tick", "--if-due").json()["status"] == "checked"
    # A check asked for (a job's follow-up, `start-now`) runs at once.
    assert cli("--json", "scheduler", "tick", "--if-due").json()["status"] == "not_due"
    state = json.loads((state_dir / "scheduler.json").read_text())
    (state_dir / "scheduler.json").write_text(json.dumps({**state, "check_requested": True}))
    assert cli("--json", "scheduler", "tick", "--if-due").json()["status"] == "checked"


def test_a_clock_set_back_does_not_stop_the_timers_checks(cli, upgraded, state_dir):
    """The host's clock is set back an hour after a check (an NTP correction, a mistaken
    `date -s` put right): the last check is an hour in the future. Before, every
    `--if-due` answered not_due for that hour, and nothing was claimed or recovered."""
    assert cli("--json", "scheduler", "tick").json()["status"] == "checked"
    state = json.loads((state_dir / "scheduler.json").read_text())
    state["last_check"] = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    (state_dir / "scheduler.json").write_text(json.dumps(state))
    assert cli("--json", "scheduler", "tick", "--if-due").json()["status"] == "checked"
    # That check set a new mark by the clock as it is: the interval counts from there.
    assert cli("--json", "scheduler", "tick", "--if-due").json()["status"] == "not_due"
    state = json.loads((state_dir / "scheduler.json").read_text())
    state["last_check"] = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    (state_dir / "scheduler.json").write_text(json.dumps(state))
    scheduler = cli("--json", "status").json()["scheduler"]
    assert scheduler["next_check"] < state["last_check"], scheduler  # due now, not in an hour


def test_a_step_unit_with_nothing_to_run_exits_75(cli, upgraded, state_dir):
    gone = cli("scheduler", "run-step", "41")
    assert gone.exit_code == 75, gone
    assert "task 41 waits on no step (it is gone)" in gone.stderr


def test_the_web_unit_is_written_when_asked_and_only_for_loopback(tmp_path, state_dir):
    target = tmp_path / "units"
    result = install(target, state_dir, "--web", "127.0.0.1:8765")
    assert result.exit_code == 0, result
    web = (target / "aiworker-web.service").read_text()
    assert f'ExecStart="{sys.executable}" -m aiworker web serve --listen "127.0.0.1:8765"' in web
    for setting in HARDENING[:-1]:
        assert setting in web.splitlines(), setting
    # The command the unit runs exists and serves.
    assert run_process("web", "serve", "--help").exit_code == 0
    refused = run_process(
        "--json", "scheduler", "install", "--dir", str(tmp_path / "other"), "--web", "0.0.0.0:80"
    )
    assert refused.exit_code == 2
    assert "loopback address only" in refused.json()["error"]["message"]
    assert not (tmp_path / "other").exists()


FLEET = ("--runner-server", "http://10.0.0.1:8766")


def test_the_runner_unit_serves_the_named_controller_with_its_own_attempt_root(tmp_path, state_dir):
    target = tmp_path / "units"
    result = install(target, state_dir, *FLEET)
    assert result.exit_code == 0, result
    runner = (target / RUNNER).read_text()
    assert '--server "http://10.0.0.1:8766"' in runner
    assert f'--attempt-root "{state_dir}/runner-attempts"' in runner
    assert f'ReadWritePaths="{state_dir}/runner-attempts"' in runner
    assert "AIWORKER_SERVER_TOKEN" not in runner.split("[Service]")[1].split("ExecStart")[0]
    assert run_process("runner", "serve", "--help").exit_code == 0
    refused = install(tmp_path / "other", state_dir, "--runner-server", "10.0.0.1:8766")
    assert refused.exit_code == 2
    assert not (tmp_path / "other").exists()


@needs_analyze
@pytest.mark.parametrize("mode", [(), ("--user",)], ids=["system", "user"])
def test_systemd_analyze_verifies_every_unit(tmp_path, state_dir, mode):
    target = tmp_path / "units"
    assert install(target, None, "--web", "127.0.0.1:8765", *FLEET).exit_code == 0
    shutil.copy(target / "aiworker-slot@.service", target / "aiworker-slot@1.service")
    shutil.copy(target / "aiworker-step@.service", target / "aiworker-step@1.service")
    units = [
        str(target / n)
        for n in (
            "aiworker-scheduler.service",
            "aiworker-scheduler.timer",
            "aiworker-slot@1.service",
            "aiworker-step@1.service",
            "aiworker-web.service",
            RUNNER,
        )
    ]
    verified = analyze("verify", *mode, *units)
    assert verified.returncode == 0, verified.stderr
    assert verified.stderr == ""


@needs_analyze
@pytest.mark.parametrize("unit", sorted(MOST_EXPOSURE))
def test_systemd_analyze_security_scores_the_hardening(tmp_path, state_dir, unit):
    target = tmp_path / "units"
    assert install(target, None, "--web", "127.0.0.1:8765", *FLEET).exit_code == 0
    shutil.copy(target / "aiworker-slot@.service", target / "aiworker-slot@1.service")
    shutil.copy(target / "aiworker-step@.service", target / "aiworker-step@1.service")
    limit = MOST_EXPOSURE[unit]
    scored = analyze(
        "security",
        "--offline=true",
        f"--threshold={int(limit * 10)}",
        str(target / unit),
    )
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", scored.stdout)
    assert level is not None, scored.stdout + scored.stderr
    assert float(level.group(1)) <= limit
    assert scored.returncode == 0, scored.stdout[-2000:]


@needs_analyze
def test_paths_with_spaces_and_percent_signs_survive(tmp_path):
    state = tmp_path / "state 100% mine"
    target = tmp_path / "units"
    assert install(target, state).exit_code == 0
    text = (target / "aiworker-scheduler.service").read_text()
    assert f'ReadWritePaths="{tmp_path}/state 100%% mine"' in text
    verified = analyze("verify", str(target / "aiworker-scheduler.service"))
    assert verified.returncode == 0, verified.stderr
    assert verified.stderr == ""


def test_provider_homes_outside_the_state_directory_are_writable_too(tmp_path, state_dir):
    config = tmp_path / "config.toml"
    config.write_text('[provider_options.claude]\nhome = "logins/claude"\n')
    target = tmp_path / "units"
    result = run_process(
        "--json",
        "scheduler",
        "install",
        "--dir",
        str(target),
        env={"AIWORKER_CONFIG": str(config)},
    )
    assert result.exit_code == 0, result
    home = tmp_path / "logins" / "claude"
    for name in SERVICES:
        lines = (target / name).read_text().splitlines()
        assert f'ReadWritePaths="{state_dir}" "{home}"' in lines, name
    assert home.stat().st_mode & 0o777 == 0o700  # made now: a unit cannot make it later


def test_a_database_and_guests_kept_elsewhere_are_writable_too(tmp_path, state_dir):
    """Under ProtectSystem=strict a unit writes only where it is told: a SQLite store
    or a guests' folder outside the state directory would be read-only to every job."""
    config = tmp_path / "config.toml"
    database = tmp_path / "data" / "aiworker.db"
    guests = tmp_path / "vm"
    config.write_text(
        f'[database]\nurl = "sqlite:///{database}"\n[execution]\nguests_dir = "{guests}"\n'
    )
    target = tmp_path / "units"
    result = run_process(
        "--json", "scheduler", "install", "--dir", str(target), env={"AIWORKER_CONFIG": str(config)}
    )
    assert result.exit_code == 0, result
    for name in SERVICES:
        lines = (target / name).read_text().splitlines()
        assert f'ReadWritePaths="{state_dir}" "{database.parent}" "{guests}"' in lines, name
    assert database.parent.is_dir()  # a unit cannot make them later
    assert guests.is_dir()


def test_a_dollar_in_the_interpreter_path_is_not_expanded_by_systemd(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from aiworker.core.scheduling import units

    monkeypatch.setattr(units, "sys", SimpleNamespace(executable="/opt/py$HOME/bin/python"))
    rendered = units.render_units(tmp_path / "c$x.toml", tmp_path / "state", 60)
    text = rendered["aiworker-scheduler.service"]
    assert 'ExecStart="/opt/py$$HOME/bin/python" -m aiworker scheduler tick' in text
    assert f'Environment="AIWORKER_CONFIG={tmp_path}/c$x.toml"' in text  # literal there


def test_a_path_systemd_cannot_hold_is_refused_and_nothing_is_written(tmp_path):
    target = tmp_path / "units"
    result = install(target, tmp_path / "state\nline")
    assert result.exit_code == 2
    assert "control character" in result.json()["error"]["message"]
    assert not target.exists()
    # The runner's unit names its attempt root in ExecStart= (where systemd expands $)
    # and in ReadWritePaths= (where it does not): a $ would part the two.
    dollar = install(target, tmp_path / "s$HOME", "--runner-server", "http://127.0.0.1:8080")
    assert dollar.exit_code == 2, dollar
    assert "the runner's unit cannot hold a $ there" in dollar.json()["error"]["message"]
    assert not target.exists()


def _tick_in_cgroup(cgroup: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    procs = os.open(cgroup / "cgroup.procs", os.O_WRONLY)
    try:
        return subprocess.run(
            [sys.executable, "-m", "aiworker", "scheduler", "tick"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, **env},
            preexec_fn=lambda: os.write(procs, b"0"),
        )
    finally:
        os.close(procs)


@pytest.fixture
def service_cgroup():
    """A real cgroup whose leaf is named like the scheduler's service."""
    mount = cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup2 hierarchy here")
    parent = mount / own_cgroup() / f"aiworker-test-{os.getpid()}"
    leaf = parent / "aiworker-scheduler.service"
    try:
        leaf.mkdir(parents=True)
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup here: {exc}")
    yield leaf
    leaf.rmdir()
    parent.rmdir()


def test_a_tick_inside_a_service_refuses_to_start_jobs_directly(service_cgroup, upgraded):
    refused = _tick_in_cgroup(service_cgroup, {"INVOCATION_ID": "0123abcd"})
    assert refused.returncode == 2, refused.stderr
    assert "aiworker-scheduler.service" in refused.stderr
    assert "scheduler.launcher systemd" in refused.stderr
    # Not a service invocation (cron, a shell): the same cgroup name alone is no reason.
    plain = _tick_in_cgroup(service_cgroup, {"INVOCATION_ID": ""})
    assert plain.returncode == 0, plain.stderr


def test_a_tick_with_the_systemd_launcher_runs_inside_a_service(service_cgroup, upgraded, cli):
    assert cli("config", "set", "scheduler.launcher", "systemd").exit_code == 0
    ran = _tick_in_cgroup(service_cgroup, {"INVOCATION_ID": "0123abcd"})
    assert ran.returncode == 0, ran.stderr


def test_a_slot_units_command_becomes_the_claimed_phase_and_logs_to_the_task(claimed, state_dir):
    from tests.test_implement import FIX, SCRIPT_ONLY, result_doc

    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    # What aiworker-slot@1.service runs: it takes the slot lock and execs the phase.
    done = run_process("scheduler", "run-slot", "1", timeout=300)
    assert done.exit_code == 0, done
    line = f"task {task}: implemented with script (attempt 1)"
    assert line in done.stdout
    # The phase's output, tee'd into the task's log as well, stamped as a detached job's.
    logged = (state_dir / "logs" / f"task-{task}.log").read_text().splitlines()
    assert any(entry.endswith(line) for entry in logged), logged
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", e) for e in logged)
    again = run_process("scheduler", "run-slot", "1")
    assert again.exit_code == 75
    assert "nothing is claimed on slot 1" in again.stderr


def test_a_refused_option_is_named_as_the_operator_wrote_it(cli, tmp_path, state_dir):
    taken = tmp_path / "a-file"
    taken.write_text("x\n")
    refused = cli("--json", "scheduler", "install", "--dir", str(taken))
    assert refused.exit_code == 2, refused
    assert refused.json()["error"]["message"] == f"--dir {taken}: exists and is not a directory"
    assert taken.read_text() == "x\n"
    web = cli("--json", "scheduler", "install", "--dir", str(tmp_path / "u"), "--web", "nonsense")
    assert web.exit_code == 2, web
    assert web.json()["error"]["message"].startswith("--web 'nonsense': expected ADDRESS:PORT")
    runner = cli("--json", "web", "serve", "--listen", "127.0.0.1:0", "--runner-listen", "bogus")
    assert runner.exit_code == 2, runner
    assert runner.json()["error"]["message"].startswith("--runner-listen 'bogus': expected")


def _systemctl(tmp_path, script: str) -> dict[str, str]:
    """A stand-in `systemctl` first on PATH (this host's PID 1 is not systemd)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "systemctl.log"}\n{script}\n')
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_a_slot_unit_that_cannot_be_started_gives_its_claim_back(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    """No user manager to start the unit (no linger, no bus): the tick fails where it is
    seen (exit 1, not the 75 a unit counts as success), and the task waits, unclaimed."""
    from tests.helpers import configure
    from tests.test_implement import query

    configure(tmp_path, forge, monkeypatch)
    assert cli("config", "set", "scheduler.launcher", "systemd").exit_code == 0
    assert cli("poll").exit_code == 0
    failing = _systemctl(tmp_path, 'echo "Failed to connect to bus: No medium found" >&2\nexit 1')
    tick = run_process("--json", "scheduler", "tick", env=failing)
    assert tick.exit_code == 1, tick
    error = tick.json()["error"]
    assert error["code"] == "launch_failed"
    assert "Failed to connect to bus" in error["message"]
    assert "the claim of task 1 was given back" in error["message"]
    assert query(upgraded, "select state, claim_slot from tasks") == [("ready", None)]
    assert query(upgraded, "select count(*) from attempts") == [(0,)]


def test_a_slot_unit_that_dies_before_its_phase_counts_against_the_budget(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    """The unit started, but its job died before it took the task up (a bad ExecStart, a
    sandboxing directive the kernel refuses): that death is charged like any other, so a
    unit that can never run ends the task instead of being started for ever."""
    from tests.helpers import configure
    from tests.test_implement import query

    configure(tmp_path, forge, monkeypatch)
    assert cli("config", "set", "scheduler.launcher", "systemd").exit_code == 0
    assert cli("poll").exit_code == 0
    started = _systemctl(tmp_path, "exit 0")  # the unit starts, and its job dies at once
    tick = run_process("--json", "scheduler", "tick", env=started)
    assert tick.exit_code == 0, tick
    assert tick.json()["started"] == [{"slot": 1, "task": 1, "unit": "aiworker-slot@1.service"}]
    assert query(upgraded, "select state, claim_token from tasks") == [("claimed", "1-unit")]
    # Past the hand-over grace a unit gets to take the slot up.
    past = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%d %H:%M:%S.%f")
    with sqlite3.connect(upgraded) as connection:
        connection.execute("update tasks set claimed_at = ?", (past,))
    again = run_process("--json", "scheduler", "tick", env=started)
    assert again.exit_code == 0, again
    [recovered] = again.json()["recovered"]
    assert recovered["task"] == 1
    assert query(upgraded, "select phase, outcome from attempts") == [
        ("implementation", "abandoned")
    ]
    assert query(upgraded, "select phase, used from budgets") == [("implementation", 1)]


def test_a_slot_unit_slow_to_start_keeps_its_claim_while_systemd_starts_it(
    forge, upgraded, tmp_path, monkeypatch, cli
):
    """On a starved host a slot unit may take minutes to start: while systemd says it is
    still activating, its claim is no dead job's, past the hand-over grace too; once the
    unit failed, the claim is recovered as a dead job's."""
    from tests.helpers import configure
    from tests.test_implement import query

    configure(tmp_path, forge, monkeypatch)
    assert cli("config", "set", "scheduler.launcher", "systemd").exit_code == 0
    assert cli("poll").exit_code == 0
    slow = _systemctl(tmp_path, 'if [ "$2" = is-active ]; then echo activating; exit 3; fi')
    assert run_process("--json", "scheduler", "tick", env=slow).exit_code == 0
    past = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%d %H:%M:%S.%f")
    with sqlite3.connect(upgraded) as connection:
        connection.execute("update tasks set claimed_at = ?", (past,))
    still = run_process("--json", "scheduler", "tick", env=slow)
    assert still.exit_code == 0, still
    assert still.json()["recovered"] == []
    assert query(upgraded, "select state, claim_token from tasks") == [("claimed", "1-unit")]
    assert "--user is-active aiworker-slot@1.service" in (tmp_path / "systemctl.log").read_text()
    failed = _systemctl(tmp_path, 'if [ "$2" = is-active ]; then echo failed; exit 3; fi')
    again = run_process("--json", "scheduler", "tick", env=failed)
    assert [r["task"] for r in again.json()["recovered"]] == [1]
    assert query(upgraded, "select phase, outcome from attempts") == [
        ("implementation", "abandoned")
    ]


def test_a_token_read_from_the_environment_is_named_in_the_install_notes(tmp_path, upgraded):
    """The units get none of the installing shell's environment: a token read from a
    variable would be missing in every job, and Environment= would show it to anyone."""
    config = tmp_path / "config.toml"
    (tmp_path / "reviewer.token").write_text("r" * 40 + "\n")
    config.write_text(
        '[forge]\nurl = "http://127.0.0.1:1"\n'
        '[forge.identities.worker]\ntoken_env = "AIWORKER_WORKER_TOKEN"\n'
        '[forge.identities.reviewer]\ntoken_file = "reviewer.token"\n'
    )
    result = run_process(
        "--json", "scheduler", "install", "--dir", str(tmp_path / "units"),
        env={"AIWORKER_CONFIG": str(config)},
    )  # fmt: skip
    assert result.exit_code == 0, result
    assert result.json()["notes"] == [
        "the units do not see $AIWORKER_WORKER_TOKEN, which worker's token is read from: keep "
        "it in a 0600 file instead (config set forge.identities.worker.token_file PATH)"
    ]
