"""The units under a real systemd: a guest of the project's own image (systemd is PID 1
there) gets aiworker as a virtual environment built on the host from a wheelhouse (the
guest reaches no registry), a sandbox forge on its own loopback and an ordinary user
with linger. As that user, `scheduler install --user` and the commands it prints, then
nothing else: the timer, slot and step units carry an assigned issue to a merged PR.
Then a second issue meets the faults a real installation meets (a slot unit killed, a
step unit stopped, the machine rebooted mid-phase) and is still delivered once.
Real QEMU under TCG, marked slow."""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest

from aiworker.runtime.guests.egress import DecisionLog, EgressPolicy, EgressProxy
from aiworker.runtime.guests.guest import Guest, StartOptions
from aiworker.runtime.guests.images import ImageStore
from aiworker.runtime.guests.machine import MachineSpec
from aiworker.runtime.guests.ssh import GuestShell, GuestUnreachable

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
HOME = "/home/dev"
VENV = f"{HOME}/venv"
STATE = f"{HOME}/.local/state/aiworker"
CONFIG = f"{HOME}/.config/aiworker/config.toml"
FORGE = "http://127.0.0.1:3000"
DEV_ENV = {
    "HOME": HOME,
    "XDG_RUNTIME_DIR": "/run/user/1000",
    "PATH": f"{VENV}/bin:/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
}
FIXED = "def add(a, b):\n    return a + b\n"
WITH_SUB = FIXED + "\n\ndef sub(a, b):\n    return a - b\n"
RESULT = {
    "contract": "ait.agent.result.v1",
    "completion": "complete",
    "summary": "done",
    "validation": [{"check_id": "ci", "command": ["./ci/run"], "exit_code": 0}],
}
APPROVE = {"result": {**RESULT, "summary": "looks right", "findings": []}}
# The review takes longer than a tick: it must outlive the tick that started it.
FIRST = {
    "edits": {"calc.py": FIXED},
    "commit_message": "Fix add()",
    "result": RESULT,
    "phases": {"review": {**APPROVE, "sleep_s": 45}},
}
# Runs played in order per task: the first implementation is killed with its unit, the
# first review's unit is stopped, the second review is cut by a reboot.
LONG = 900
SECOND = {
    "phases": {
        "implementation": [
            {"edits": {"calc.py": WITH_SUB}, "result": RESULT, "sleep_s": LONG},
            {"edits": {"calc.py": WITH_SUB}, "commit_message": "Add sub()", "result": RESULT},
        ],
        "review": [{**APPROVE, "sleep_s": LONG}, {**APPROVE, "sleep_s": LONG}, APPROVE],
    }
}
FORGE_UNIT = f"""[Unit]
Description=the sandbox forge for this test

[Service]
ExecStart={VENV}/bin/python -m aiworker sandbox serve --data {HOME}/forge --port 3000

[Install]
WantedBy=default.target
"""


def host_python_matches_the_guest() -> str | None:
    """The venv is built on the host with Debian's own python3, the guest's very build."""
    found = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip() if found.returncode == 0 else None


@pytest.fixture(scope="session")
def guest_venv(tmp_path_factory) -> Path:
    """A wheelhouse of aiworker and its dependencies built on the host, installed offline
    into a venv of Debian's python3 whose paths are the guest's."""
    if host_python_matches_the_guest() is None:
        pytest.fail("the host needs Debian's /usr/bin/python3 to build the guest's venv")
    root = tmp_path_factory.mktemp("guest-venv")
    wheels = root / "wheels"
    pip = [sys.executable, "-m", "pip"]
    built = subprocess.run(
        [*pip, "wheel", "-q", "-w", str(wheels), "-c", str(REPO / "constraints.txt"), str(REPO)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    venv = root / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    offline = ["--no-index", "--find-links", str(wheels)]
    installed = subprocess.run(
        [*pip, "--python", str(venv / "bin" / "python"), "install", "-q", *offline, "aiworker"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    # The venv moves to the guest's path: its scripts and configuration name it.
    for path in [*(venv / "bin").iterdir(), venv / "pyvenv.cfg"]:
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if str(venv).encode() in data:
                path.write_bytes(data.replace(str(venv).encode(), VENV.encode()))
    return venv


class Machine:
    """The guest as the test drives it: commands as root or as dev, reconnecting after a
    reboot."""

    def __init__(self, guest: Guest) -> None:
        self.guest = guest

    @property
    def shell(self) -> GuestShell:
        assert self.guest.shell is not None
        return self.guest.shell

    def root(self, line: str, timeout: float = 900) -> str:
        done = self.shell.run(line, timeout=timeout)
        assert done.exit_code == 0, (line, done.exit_code, done.stdout[-2000:], done.stderr[-3000:])
        return done.stdout.decode()

    def dev(self, line: str, timeout: float = 900) -> str:
        return self.root(dev_line(line), timeout)

    def dev_try(self, line: str, timeout: float = 900):
        return self.shell.run(dev_line(line), timeout=timeout)

    def aiworker(self, *args: str, timeout: float = 900) -> str:
        return self.dev(shlex.join([f"{VENV}/bin/python", "-m", "aiworker", *args]), timeout)

    def query(self, sql: str) -> list:
        """The controller's database, read-only, with the guest's plain python3 (-S: site
        alone doubles its start-up, 0.8 s of the guest's CPU under TCG)."""
        script = (
            "import json, sqlite3, sys; "
            f"c = sqlite3.connect('file:{STATE}/aiworker.db?mode=ro', uri=True); "
            "print(json.dumps(c.execute(sys.argv[1]).fetchall()))"
        )
        return json.loads(self.root(f"python3 -S -c {shlex.quote(script)} {shlex.quote(sql)}"))

    def forge(self, method: str, path: str, token: str, body: dict | None = None):
        data = f"-d {shlex.quote(json.dumps(body))}" if body is not None else ""
        out = self.root(
            f"curl -sf -X {method} -H 'Authorization: token {token}' "
            f"-H 'Content-Type: application/json' {data} {FORGE}/api/v1{path}"
        )
        return json.loads(out) if out.strip() else None

    def unit(self, name: str, *properties: str) -> dict[str, str]:
        shown = self.dev(f"systemctl --user show {name} " + " ".join(f"-p {p}" for p in properties))
        return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)

    def wait_for(self, what: str, probe, timeout: float, step: float = 15.0):
        """Probe every STEP seconds: each probe runs commands in the guest (an SSH channel
        and a python3, 1.7 s of its CPU under TCG), taken from the units being waited for.
        Not reached: the error says what the controller and the units said meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = probe()
            if found:
                print(f"[{time.monotonic() - STARTED:7.1f} s] {what}")  # shown when it fails
                return found
            time.sleep(step)
        raise AssertionError(f"not reached within {timeout:.0f} s: {what}\n{self.explain()}")

    def explain(self) -> str:
        """The controller's status and its units' last journal lines, for a failure."""
        said = []
        for line in (
            f"{VENV}/bin/python -m aiworker status",
            "systemctl --user list-units --all --no-pager 'aiworker*'",
            "journalctl --user --no-pager -n 150 -o short-monotonic",
        ):
            with contextlib.suppress(Exception):
                done = self.dev_try(line, timeout=300)
                said.append(f"$ {line}\n{done.stdout.decode(errors='replace')[-6000:]}")
                said.append(done.stderr.decode(errors="replace")[-2000:])
        return "\n".join(said)

    def reboot(self) -> None:
        """`systemctl reboot` in the guest; the same QEMU resets it (reboot=reset), so its
        disk and SSH port stay; wait until SSH answers again."""
        # The connection may break under the command: that is the reboot going on.
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException, GuestUnreachable):
            self.shell.run("systemctl reboot", timeout=20)
        self.shell.close()
        self.guest.shell = None
        time.sleep(5)
        image = self.guest.image
        assert self.guest.port is not None
        self.guest.shell = GuestShell.connect(
            self.guest.port, image.host_key, image.client_key, time.monotonic() + 900
        )


def dev_line(line: str) -> str:
    variables = " ".join(f"{k}={shlex.quote(v)}" for k, v in DEV_ENV.items())
    return f"runuser -u dev -- env -i {variables} sh -c {shlex.quote(f'cd {HOME} && {line}')}"


STARTED = time.monotonic()


@pytest.fixture
def machine(guests_dir, guest_venv, tmp_path):
    store = ImageStore(guests_dir)
    image = store.current()
    proxy = EgressProxy(EgressPolicy(hosts=()), DecisionLog(tmp_path / "egress.jsonl", "test"))
    spec = MachineSpec(**image.manifest()["machine"])
    guest = Guest.start(store, image, StartOptions("systemd", proxy.port, spec))
    try:
        assert guest.qmp is not None
        # The guest runs at the tests' own priority: it needs about 10 minutes of CPU
        # (measured alone: 600 s in 11.5 minutes), and at the lowest priority the tests
        # beside it left it so little that it missed its 45 minutes.
        # A reboot in the guest resets this QEMU instead of ending it (-no-reboot).
        guest.qmp.execute("set-action", reboot="reset")
        # A restored clone was given a new machine id; journald, started before, still
        # writes under the saved one, where `journalctl` does not look.
        guest.shell.check("systemctl restart systemd-journald", timeout=120)
        guest.shell.put_tree(guest_venv, VENV)  # owned by dev
        yield Machine(guest)
    finally:
        guest.stop()
        proxy.close()


def set_up_forge_and_configuration(m: Machine) -> dict[str, str]:
    seeded = json.loads(m.aiworker("--json", "sandbox", "seed", "--data", f"{HOME}/forge"))
    tokens = {user["login"]: user["token"] for user in seeded["users"]}
    lines = [
        "shares = 1",
        # Jobs that made progress ask for the next check at once; the interval only
        # paces recovery (and keeps full ticks from crowding the guest's CPUs).
        "check_interval = 60",
        'providers = ["script"]',
        "[provider_options.script]",
        f'scenario = "{HOME}/scenario.json"',
        "[forge]",
        f'url = "{FORGE}"',
    ]
    roles = {"planner": "planner-bot", "worker": "worker-bot", "reviewer": "reviewer-bot"}
    m.dev(f"mkdir -p -m 0700 {HOME}/.config/aiworker/tokens")
    for role, login in {**roles, "operator": "admin"}.items():
        path = f"{HOME}/.config/aiworker/tokens/{role}.token"
        m.dev(f"umask 077 && printf '%s\\n' {tokens[login]} > {path}")
        lines += [f"[forge.identities.{role}]", f'token_file = "{path}"']
    lines += ["[[repositories]]", "index = 1", 'owner = "team"', 'name = "app"']
    m.dev(f"umask 077 && printf '%s\\n' {shlex.quote(chr(10).join(lines))} > {CONFIG}")
    m.dev(f"printf '%s' {shlex.quote(json.dumps(FIRST))} > {HOME}/scenario.json")
    m.aiworker("db", "upgrade")
    return tokens


def task_state(m: Machine, task: int) -> str | None:
    rows = m.query(f"select state from tasks where id = {task}")
    return rows[0][0] if rows else None


def open_attempts(m: Machine, task: int, phase: str) -> list:
    return m.query(
        f"select id from attempts where task_id = {task} and phase = '{phase}' "
        "and finished_at is null"
    )


def journal_units(m: Machine) -> set[str]:
    """The user units the journal has lines from (-m: a restored clone's machine id is
    not the one journald writes under)."""
    out = m.root("journalctl -m --no-pager -o json _UID=1000", timeout=120)
    units = set()
    for line in out.splitlines():
        entry = json.loads(line)
        units.add(entry.get("_SYSTEMD_USER_UNIT") or entry.get("USER_UNIT") or "")
    return units


def test_the_units_deliver_under_systemd_and_survive_kills_stops_and_a_reboot(machine):
    m = machine
    tokens = set_up_forge_and_configuration(m)
    installed = json.loads(m.aiworker("--json", "scheduler", "install", "--user"))
    steps = installed["next_steps"]
    assert steps[1] == "sudo loginctl enable-linger dev"
    m.dev(steps[0])  # the launcher, in the configuration the units read
    m.root(steps[1])  # dev is no sudoer: root runs it, as printed
    m.wait_for(
        "dev's own systemd",
        lambda: (
            m.dev_try("systemctl --user is-system-running").stdout.strip()
            in (b"running", b"degraded")
        ),
        timeout=600,
        step=5,
    )
    m.dev(f"printf '%s' {shlex.quote(FORGE_UNIT)} > {HOME}/.config/systemd/user/forge.service")
    m.dev("systemctl --user daemon-reload && systemctl --user enable --now forge.service")
    m.wait_for(
        "the forge", lambda: m.dev_try(f"curl -sf {FORGE}/api/v1/version").exit_code == 0, 600, 5
    )
    for step in steps[2:]:
        m.dev(step)
    verified = m.dev_try(
        # The image carries no manual pages: Documentation= is not checked there.
        "systemd-analyze --user verify --man=no ~/.config/systemd/user/aiworker-scheduler.service "
        "~/.config/systemd/user/aiworker-scheduler.timer"
    )
    assert verified.exit_code == 0, verified.stderr
    for unit in ("aiworker-scheduler.service", "aiworker-slot@1.service"):
        scored = m.dev(f"systemd-analyze --user security {unit} --no-pager || true")
        assert "Overall exposure level" in scored, scored

    # Nothing else: issue #1 is assigned to worker-bot by a writer; the timer does the rest.
    review_seen = {}

    def delivered_with_the_review_outliving_its_tick():
        # One query per probe: each costs the guest a python3 and an SSH channel.
        [(state, reviewing)] = m.query(
            "select state, (select count(*) from attempts where task_id = 1 and "
            "phase = 'review' and finished_at is null) from tasks where id = 1"
        ) or [(None, 0)]
        if not review_seen and reviewing:
            step = m.unit("aiworker-step@1.service", "ActiveState", "ActiveEnterTimestampMonotonic")
            tick = m.unit("aiworker-scheduler.service", "InactiveEnterTimestampMonotonic")
            started = int(step["ActiveEnterTimestampMonotonic"])
            if (
                step["ActiveState"] == "active"
                and int(tick["InactiveEnterTimestampMonotonic"]) > started
            ):
                review_seen["outlived"] = True
        assert state not in ("failed", "needs_input", "cancelled"), m.aiworker("task", "show", "1")
        return state == "done"

    m.wait_for("issue #1 delivered", delivered_with_the_review_outliving_its_tick, 2700)
    assert review_seen == {"outlived": True}
    [pull] = m.forge("GET", "/repos/team/app/pulls?state=all", tokens["admin"])
    assert pull["merged"] is True
    units = journal_units(m)
    assert {"aiworker-scheduler.service", "aiworker-slot@1.service"} <= units, units
    assert "aiworker-step@1.service" in units, units

    # The faults, on issue #2.
    m.dev(f"printf '%s' {shlex.quote(json.dumps(SECOND))} > {HOME}/scenario.json")
    m.forge("PATCH", "/repos/team/app/issues/2", tokens["alice"], {"assignees": ["worker-bot"]})
    m.wait_for("the first implementation", lambda: open_attempts(m, 2, "implementation"), 1800)
    m.dev("systemctl --user kill -s KILL aiworker-slot@1.service")
    m.wait_for(
        "the killed implementation recovered as abandoned",
        lambda: m.query(
            "select 1 from attempts where task_id = 2 and phase = 'implementation' "
            "and outcome = 'abandoned'"
        ),
        1800,
    )
    [first_review] = m.wait_for("the first review", lambda: open_attempts(m, 2, "review"), 2700)
    m.dev("systemctl --user stop aiworker-step@2.service")
    closed = m.query(f"select outcome from attempts where id = {first_review[0]}")
    assert closed[0][0] is not None, closed  # the stop closed it: the guard ran
    second_review = m.wait_for(
        "a second review",
        lambda: [a for a in open_attempts(m, 2, "review") if a != first_review],
        1800,
    )
    assert second_review
    m.reboot()
    m.wait_for("issue #2 delivered after the reboot", lambda: task_state(m, 2) == "done", 2700)

    pulls = m.forge("GET", "/repos/team/app/pulls?state=all", tokens["admin"])
    assert sorted(p["merged"] for p in pulls) == [True, True]
    assert len(pulls) == 2  # one PR per issue: nothing published twice
    assert m.query("select count(*) from attempts where finished_at is null") == [[0]]
    outcomes = m.query("select phase, outcome from attempts where task_id = 2 order by id")
    assert ["implementation", "abandoned"] in outcomes, outcomes
    reviews = [o for p, o in outcomes if p == "review"]
    assert len(reviews) == 3, outcomes
    [merged] = [p for p in pulls if "sub" in p["title"].lower() or p["number"] != pull["number"]]
    posted = m.forge("GET", f"/repos/team/app/pulls/{merged['number']}/reviews", tokens["admin"])
    assert [r["state"] for r in posted] == ["APPROVED"]  # the cut reviews posted nothing
