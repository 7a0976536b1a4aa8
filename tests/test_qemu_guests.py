"""Phases, checks and operators' guests in real QEMU (TCG here), on the image the
fixture provisioned with `aiworker qemu provision`."""

from __future__ import annotations

import base64
import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from aiworker.runtime.guests.backend import as_dev, proxy_env
from aiworker.runtime.guests.egress import DecisionLog, EgressPolicy, EgressProxy
from aiworker.runtime.guests.guest import Guest, StartOptions
from aiworker.runtime.guests.images import ImageStore
from aiworker.runtime.guests.keys import new_key_pair
from aiworker.runtime.guests.machine import MachineSpec
from aiworker.runtime.guests.ssh import GuestShell, HostKeyRefused
from aiworker.runtime.processes import process_alive
from tests.helpers import run_process
from tests.json_keys import assert_keys
from tests.test_lifecycle import start_implement as implement_process

pytestmark = pytest.mark.slow

FIX = "def add(a, b):\n    return a + b\n"
# Part of the change the agent makes: the gate's ./ci/run runs it, so the gate passes only
# when the check ran in the guest as its unprivileged user.
WHERE = (
    "import os\nimport unittest\n\n\nclass WhereTest(unittest.TestCase):\n"
    "    def test_runs_in_the_guest(self):\n"
    "        self.assertEqual(os.uname().nodename, 'guest')\n"
    "        self.assertEqual(os.getuid(), 1000)\n"
)
RESULT = {
    "contract": "ait.agent.result.v1",
    "completion": "complete",
    "summary": "Fixed add()",
    "validation": [{"check_id": "ci", "command": ["./ci/run"], "exit_code": 0}],
}
# Looks for a secret (given base64-encoded, so the command line does not hold it) in the
# guest's files where a token would land, and in every process's environment and argv.
FIND = """
import base64, os, sys
secret = base64.b64decode(sys.argv[1])
hits = []
for top in ("/home", "/root", "/tmp", "/etc", "/var/tmp", "/run", "/opt", "/srv"):
    for folder, _, files in os.walk(top):
        for name in files:
            path = os.path.join(folder, name)
            try:
                if os.path.isfile(path) and secret in open(path, "rb").read():
                    hits.append(path)
            except OSError:
                pass
for pid in filter(str.isdigit, os.listdir("/proc")):
    for part in ("environ", "cmdline"):
        try:
            if secret in open(f"/proc/{pid}/{part}", "rb").read():
                hits.append(f"/proc/{pid}/{part}")
        except OSError:
            pass
print(hits)
"""


def query(db, sql):
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def qemu_config(guests_dir: Path, home: Path | None = None) -> str:
    lines = ['providers = ["script"]', "[provider_options.script]", 'scenario = "scenario.json"']
    if home is not None:
        lines.append(f'home = "{home}"')
    lines += ["[execution]", 'backend = "qemu"', f'guests_dir = "{guests_dir}"']
    return "\n".join(lines) + "\n"


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_phase_left():
    yield
    while STARTED:
        phase = STARTED.pop()
        if phase.poll() is None:
            phase.kill()
        phase.communicate()


def start_implement(task: int) -> subprocess.Popen:
    STARTED.append(phase := implement_process(task))
    return phase


def guest_of(phase: subprocess.Popen, purpose: str, timeout: float = 240) -> dict:
    """The running guest of PURPOSE, once it appears in `qemu list` with its SSH port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = run_process("--json", "qemu", "list").json()
        for guest in listed["guests"]:
            if guest["purpose"] == purpose and guest["port"]:
                return guest
        if phase.poll() is not None:
            raise AssertionError(f"the phase ended first: {phase.communicate()}")
        time.sleep(0.5)
    raise AssertionError(f"no {purpose} guest appeared")


def in_guest(name: str, *command: str, timeout: float = 120):
    return run_process("qemu", "ssh", name, "--", *command, timeout=timeout)


def wait_until(predicate, timeout: float = 120, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(step)
    raise AssertionError("condition not reached in time")


def qemu_processes(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"qemu-system" in argv and marker.encode() in argv:
            found.append(int(pid))
    return found


def test_a_phase_runs_in_a_guest_with_its_login_lent_and_its_commits_come_back(
    claimed, upgraded, guests_dir, forge, tmp_path
):
    login = tmp_path / "login"
    login.mkdir()
    (login / "auth.json").write_text(json.dumps({"account_id": "acct-1", "token": "old"}))
    refreshed = json.dumps({"account_id": "acct-1", "token": "refreshed"})
    task = claimed(
        qemu_config(guests_dir, login),
        edits={"calc.py": FIX, "test_where.py": WHERE},
        result=RESULT,
        home_files={"auth.json": refreshed},
        sleep_s=25,
    )
    phase = start_implement(task)
    guest = guest_of(phase, "implementation")
    name = guest["name"]
    # While the provider runs: its login is in a tmpfs, the checkout is the guest's own,
    # and the forge token the host holds is nowhere in the guest.
    wait_until(lambda: in_guest(name, "mountpoint", "-q", "/run/aiworker-creds").exit_code == 0)
    listing = in_guest(
        name,
        "sh",
        "-c",
        "ls /run/aiworker-creds/*/ && git -c safe.directory=* -C /home/dev/work/repo rev-parse "
        "--abbrev-ref HEAD",
    )
    assert listing.exit_code == 0, listing
    assert "auth.json" in listing.stdout
    assert listing.stdout.strip().endswith("work")
    canary = base64.b64encode(forge.tokens["worker-bot"].encode()).decode()
    found = in_guest(name, "python3", "-c", FIND, canary)
    assert (found.exit_code, found.stdout.strip()) == (0, "[]"), found
    out, err = phase.communicate(timeout=600)
    assert phase.returncode == 0, err
    report = json.loads(out)
    assert (report["outcome"], report["gate"]["passed"]) == ("implemented", True), report
    assert query(upgraded, "select check_id, outcome, head_commit from receipts") == [
        ("ci", "pass", report["head"])
    ]
    [settings] = query(upgraded, "select settings from attempts")
    recorded = json.loads(settings[0])
    assert (recorded["backend"], recorded["accel"]) == ("qemu", "tcg")
    # The commits came out of the guest through the artifact store, kept with the attempt.
    [(digest,)] = query(upgraded, "select sha256 from artifacts where name = 'result.bundle'")
    assert list((upgraded.parent / "artifacts" / "partial").iterdir()) == []
    assert (upgraded.parent / "artifacts" / "sha256" / digest[:2] / digest).is_file()
    # The refreshed login (same account) came back; the guest and its overlay are gone.
    assert json.loads((login / "auth.json").read_text())["token"] == "refreshed"
    assert list((guests_dir / "run").iterdir()) == []
    assert qemu_processes(str(guests_dir)) == []


class _Mirror(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the mirror\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


PROBE = """
import json, os, socket, urllib.request
os.environ.pop("no_proxy", None)  # "localhost" must go to the proxy too
proxy = urllib.request.ProxyHandler({"http": "http://10.0.2.100:3128"})
opener = urllib.request.build_opener(proxy)
out = {}
def fetch(key, url):
    try:
        with opener.open(url, timeout=20) as reply:
            out[key] = [reply.status, reply.read().decode()]
    except urllib.error.HTTPError as exc:
        out[key] = [exc.code, exc.read().decode()]
    except Exception as exc:
        out[key] = ["error", type(exc).__name__]
def connect(key, host, port):
    try:
        socket.create_connection((host, port), timeout=4).close()
        out[key] = "open"
    except OSError as exc:
        out[key] = type(exc).__name__
fetch("mirror", "http://127.0.0.77/")
fetch("loopback_name", "http://localhost/")
fetch("unlisted", "http://example.org/")
fetch("other_port", "http://127.0.0.77:8080/")
tunnel = socket.create_connection(("10.0.2.100", 3128), timeout=20)
tunnel.sendall(b"CONNECT 127.0.0.77:80 HTTP/1.1\\r\\nHost: 127.0.0.77:80\\r\\n\\r\\n")
answer = tunnel.recv(4096)
tunnel.sendall(b"GET / HTTP/1.0\\r\\nHost: 127.0.0.77\\r\\n\\r\\n")
data = b""
while chunk := tunnel.recv(4096):
    data += chunk
out["tunnel"] = [answer.split(b"\\r\\n")[0].decode(), data.endswith(b"hello from the mirror\\n")]
connect("host_loopback", "10.0.2.2", HOST_PORT)
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with direct.open("http://10.0.2.101:8080/model", timeout=20) as reply:
    out["model"] = [reply.status, reply.read().decode()]
connect("model_other_port", "10.0.2.101", 8081)
connect("private", "192.168.1.1", 80)
connect("dns", "10.0.2.3", 53)
connect("public", "1.1.1.1", 443)
print(json.dumps(out))
"""


def test_a_guest_reaches_only_allowlisted_hosts_through_the_proxy_and_pins_its_host_key(
    guests_dir, tmp_path
):
    mirror = ThreadingHTTPServer(("127.0.0.77", 80), _Mirror)
    local = ThreadingHTTPServer(("127.0.0.1", 0), _Mirror)  # a host loopback service
    for server in (mirror, local):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    store = ImageStore(guests_dir)
    image = store.current()
    decisions = tmp_path / "egress.jsonl"
    policy = EgressPolicy(
        hosts=("127.0.0.77", "localhost", "*.example.org"), trusted=("127.0.0.77/32",)
    )
    proxy = EgressProxy(policy, DecisionLog(decisions, "test"))
    machine = MachineSpec(**image.manifest()["machine"])
    # The local model server's own forwarder leads to that one server (here the loopback
    # service the guest cannot otherwise reach).
    model = f"127.0.0.1:{local.server_address[1]}"
    guest = Guest.start(
        store, image, StartOptions("egress", proxy.port, machine, model_target=model)
    )
    try:
        assert guest.restored
        script = PROBE.replace("HOST_PORT", str(local.server_address[1]))
        done = guest.shell.run(
            as_dev(f"python3 -c {shlex.quote(script)}", proxy_env(), cwd="/home/dev"), timeout=120
        )
        assert done.exit_code == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["mirror"] == [200, "hello from the mirror\n"]
        assert out["model"] == [200, "hello from the mirror\n"]
        assert out["model_other_port"] != "open"
        assert out["tunnel"] == ["HTTP/1.1 200 Connection Established", True]
        assert out["loopback_name"][0] == 403
        assert "resolves to a non-public address" in out["loopback_name"][1]
        assert out["unlisted"][0] == 403
        assert "not on the allowlist" in out["unlisted"][1]
        assert out["other_port"][0] == 403
        assert "port 8080" in out["other_port"][1]
        for key in ("host_loopback", "private", "dns", "public"):
            assert out[key] != "open", (key, out)
        logged = [json.loads(line) for line in decisions.read_text().splitlines()]
        assert {(d["host"], d["allowed"]) for d in logged} >= {
            ("127.0.0.77", True),
            ("localhost", False),
            ("example.org", False),
        }
        # Another key than the pinned one is refused, never learnt.
        other = new_key_pair(tmp_path / "other", "other")
        with pytest.raises(HostKeyRefused):
            GuestShell.connect(guest.port, other, image.client_key, time.monotonic() + 20)
    finally:
        guest.stop()
        proxy.close()
        for server in (mirror, local):
            server.shutdown()
            server.server_close()
    assert list((guests_dir / "run").iterdir()) == []


def test_killing_a_job_mid_phase_leaves_no_qemu_and_recovery_removes_the_overlay(
    claimed, upgraded, guests_dir
):
    task = claimed(qemu_config(guests_dir), edits={"calc.py": FIX}, result=RESULT, sleep_s=120)
    phase = start_implement(task)
    guest = guest_of(phase, "implementation")
    wait_until(
        lambda: in_guest(guest["name"], "mountpoint", "-q", "/run/aiworker-creds").exit_code == 0
    )
    phase.send_signal(signal.SIGKILL)
    phase.communicate()
    wait_until(lambda: not process_alive(guest["pid"]), timeout=10, step=0.1)
    assert (guests_dir / "run" / guest["name"] / "overlay.qcow2").exists()
    tick = run_process("--json", "scheduler", "tick", timeout=120)
    assert tick.exit_code == 0, tick
    assert tick.json()["guests_swept"] == [guest["name"]]
    assert list((guests_dir / "run").iterdir()) == []
    assert query(upgraded, "select outcome from attempts") == [("abandoned",)]


def test_a_phase_killed_while_its_commits_come_out_of_the_guest_publishes_nothing(
    claimed, upgraded, guests_dir, monkeypatch
):
    """The guest dies with the phase that owns it, so its bundle cannot be fetched on:
    what was received stays a part nothing names (the retention pass reclaims it), and
    the attempt is recovered as a dead job's."""
    task = claimed(qemu_config(guests_dir), edits={"calc.py": FIX}, result=RESULT)
    monkeypatch.setenv("AIWORKER_FAILPOINT", "guest_transfer.after_chunk")
    phase = start_implement(task)
    monkeypatch.delenv("AIWORKER_FAILPOINT")
    _out, err = phase.communicate(timeout=600)
    assert phase.returncode == -9, err
    artifacts = upgraded.parent / "artifacts"
    [part] = list((artifacts / "partial").glob("*.part"))
    digest = part.name.removesuffix(".part")
    assert part.stat().st_size > 0
    assert not (artifacts / "sha256" / digest[:2] / digest).exists()
    assert query(upgraded, "select count(*) from artifacts where name = 'result.bundle'") == [(0,)]
    tick = run_process("--json", "scheduler", "tick", timeout=120)
    assert tick.exit_code == 0, tick
    assert query(upgraded, "select outcome from attempts") == [("abandoned",)]
    assert list((guests_dir / "run").iterdir()) == []
    assert query(upgraded, "select count(*) from artifacts where sha256 = '" + digest + "'") == [
        (0,)
    ]


def test_an_operator_boots_enters_and_stops_a_guest(guests_dir, tmp_path, monkeypatch):
    config = tmp_path / "config.toml"
    config.write_text(f'[execution]\nguests_dir = "{guests_dir}"\n')
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))
    booted = run_process("--json", "qemu", "boot", timeout=300)
    assert booted.exit_code == 0, booted
    assert_keys("qemu boot", booted.json())
    assert booted.json()["restored"] is True
    name = booted.json()["name"]
    listed = run_process("--json", "qemu", "list").json()
    assert listed["backend"] == "qemu"
    [guest] = listed["guests"]
    assert (guest["name"], guest["owner"], guest["alive"]) == (name, "operator", True)
    assert listed["images"][0]["used_by"] == [name]
    ran = in_guest(name, "sh", "-c", "id -un; exit 7")
    assert (ran.exit_code, ran.stdout) == (7, "root\n")
    stopped = run_process("--json", "qemu", "stop", name)
    assert stopped.exit_code == 0, stopped
    assert_keys("qemu stop", stopped.json())
    wait_until(lambda: not process_alive(guest["pid"]), timeout=10, step=0.1)
    assert run_process("--json", "qemu", "list").json()["guests"] == []
    missing = run_process("qemu", "ssh", name, "--", "true")
    assert missing.exit_code == 2
    assert f"no guest named {name!r}" in missing.stderr


STALLED_SFTP = (
    "printf '#!/bin/sh\\nexec sleep 100000\\n' > /tmp/stall && chmod 755 /tmp/stall && "
    "mount --bind /tmp/stall /usr/lib/openssh/sftp-server && echo x > /root/f"
)


def test_a_guest_command_ends_with_its_exit_and_a_stalled_guest_fails_in_bounded_time(
    guests_dir, tmp_path, monkeypatch
):
    """What the guest's processes do cannot hold the host: a background child that keeps
    the output open is drained for 10 s after the command exits (as on the local
    backend), a command that closes its output is waited for without spinning, and an
    SFTP server that never answers is a broken connection, not a hang."""
    from aiworker.runtime.artifact_files import ArtifactFiles
    from aiworker.runtime.guests import ssh, transfer
    from aiworker.runtime.guests.ssh import GuestUnreachable

    store = ImageStore(guests_dir)
    image = store.current()
    proxy = EgressProxy(EgressPolicy(), DecisionLog(tmp_path / "egress.jsonl", "test"))
    machine = MachineSpec(**image.manifest()["machine"])
    guest = Guest.start(store, image, StartOptions("bounded", proxy.port, machine))
    try:
        spec = tmp_path / "remote.json"
        command = as_dev("sleep 120 & echo main-done; exit 3", proxy_env(), cwd="/home/dev")
        key = {"host_key": image.host_key, "client_key": str(image.client_key)}
        spec.write_text(json.dumps({"port": guest.port, "command": command, **key}))
        started = time.monotonic()
        argv = [sys.executable, "-m", "aiworker.guest_exec", str(spec)]
        done = subprocess.run(argv, capture_output=True, timeout=150, check=False)
        assert (done.returncode, done.stdout) == (3, b"main-done\n"), done
        assert time.monotonic() - started < 60  # not the 120 s of the child it left
        cpu = time.process_time()
        closed = as_dev("exec >&- 2>&-; sleep 10", proxy_env(), cwd="/home/dev")
        assert guest.shell.run(closed, timeout=60).exit_code == 0
        assert time.process_time() - cpu < 3  # waited for, not polled in a loop
        # A guest that names the digest of bytes the store holds must still hold them.
        files = ArtifactFiles(tmp_path / "a")
        assert guest.shell.run("echo real > /root/real && echo fake > /root/fake").ok
        digest, _ = transfer.fetch_verified(guest, "/root/real", files, 1 << 20)
        lie = f"printf '#!/bin/sh\\necho \"{digest}  -\"\\n' > /tmp/sum && chmod 755 /tmp/sum"
        assert guest.shell.run(f"{lie} && mount --bind /tmp/sum /usr/bin/sha256sum").ok
        with pytest.raises(GuestUnreachable, match="not the file it described"):
            transfer.fetch_verified(guest, "/root/fake", files, 1 << 20)
        assert guest.shell.run(STALLED_SFTP).exit_code == 0  # as the guest's root may
        started = time.monotonic()
        broke = pytest.raises(GuestUnreachable, match="SFTP with the guest broke")
        with broke, guest.shell.sftp(stall_s=3) as sftp:
            sftp.stat("/root/f")
        assert time.monotonic() - started < 30
        monkeypatch.setattr(transfer, "STALL_S", 2.0)
        with pytest.raises(GuestUnreachable):
            transfer.fetch_verified(guest, "/root/f", ArtifactFiles(tmp_path / "b"), 1 << 20)
        assert time.monotonic() - started < 150
        # A guest that freezes after the command's channel opened never answers its
        # request: the command fails in bounded time instead of waiting for ever.
        transport = guest.shell.client.get_transport()
        opened = transport.open_session

        def open_then_freeze(*args: object, **kwargs: object) -> object:
            channel = opened(*args, **kwargs)
            os.kill(guest.pid, signal.SIGSTOP)
            return channel

        monkeypatch.setattr(transport, "open_session", open_then_freeze)
        monkeypatch.setattr(ssh, "REQUEST_S", 3.0)
        started = time.monotonic()
        try:
            with pytest.raises(GuestUnreachable, match="did not answer exec_command within 3 s"):
                guest.shell.run("true", timeout=600)
        finally:
            os.kill(guest.pid, signal.SIGCONT)
        assert time.monotonic() - started < 30
    finally:
        guest.stop()
        proxy.close()


BROKEN_RECIPE = """#!/bin/sh
# An image that cannot boot: no kernel, an empty disk.
set -eu
echo not-a-kernel > "$OUT/vmlinuz"
echo not-an-initrd > "$OUT/initrd.img"
qemu-img create -q -f qcow2 "$OUT/base.qcow2" 64M
printf '{"files": {}, "append": "console=ttyS0"}' > "$OUT/manifest.json"
"""


def test_provisioning_replaces_the_image_only_with_one_that_boots_and_refuses_while_jobs_run(
    guests_dir, tmp_path, monkeypatch
):
    config = tmp_path / "config.toml"
    config.write_text(f'[execution]\nguests_dir = "{guests_dir}"\nboot_deadline_s = 10\n')
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))
    current = (guests_dir / "current").resolve()
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    (recipe / "build.sh").write_text(BROKEN_RECIPE)
    failed = run_process("--json", "qemu", "provision", "--recipe", str(recipe), timeout=300)
    assert failed.exit_code == 1, failed
    assert "QEMU exited" in failed.json()["error"]["message"]
    assert (guests_dir / "current").resolve() == current
    assert [p.name for p in (guests_dir / "images").iterdir()] == [current.name]
    assert list((guests_dir / "run").iterdir()) == []
    # A job holds its slot: provisioning refuses (75) and builds nothing.
    from aiworker.runtime.locks import LockDir

    slot = LockDir(tmp_path / "state").slot(1)
    assert slot.try_acquire()
    try:
        busy = run_process(
            "--state-dir", str(tmp_path / "state"), "--json", "qemu", "provision", "--wait", "1"
        )
    finally:
        slot.release()
    assert busy.exit_code == 75, busy
    assert "jobs are running (slot 1)" in busy.json()["error"]["message"]
    assert [p.name for p in (guests_dir / "images").iterdir()] == [current.name]
    no_recipe = run_process("--json", "qemu", "provision", "--recipe", str(tmp_path / "none"))
    assert no_recipe.exit_code == 2
    assert "build.sh missing" in no_recipe.json()["error"]["message"]


LAYER_SCRIPT = (
    "#!/bin/sh\nset -eu\nmkdir -p /var/cache/deps\necho cached > /var/cache/deps/marker\n"
)


def test_a_cache_layer_keeps_what_its_script_wrote_without_rewriting_the_base(
    guests_dir, tmp_path, monkeypatch
):
    name = f"t{os.getpid()}"
    shared = (guests_dir / "current").resolve()
    config = tmp_path / "config.toml"
    config.write_text(f'[execution]\nguests_dir = "{guests_dir}"\n')
    monkeypatch.setenv("AIWORKER_CONFIG", str(config))
    script = tmp_path / "layer.sh"
    script.write_text(LAYER_SCRIPT)
    try:
        built = run_process("--json", "qemu", "layer", name, "--script", str(script), timeout=600)
        assert built.exit_code == 0, built
        assert_keys("qemu layer", built.json())
        broken = tmp_path / "broken.sh"
        broken.write_text("#!/bin/sh\necho no-space-left >&2\nexit 3\n")
        failed = run_process("--json", "qemu", "layer", "bad", "--script", str(broken), timeout=600)
        assert failed.exit_code == 1
        assert "the layer script exited 3: no-space-left" in failed.json()["error"]["message"]
        assert not (shared / "layers" / "bad").exists()
        seen = {}
        for layer in (name, None):
            lines = [f'[execution]\nguests_dir = "{guests_dir}"']
            lines += [f'cache_layer = "{layer}"'] if layer else []
            config.write_text("\n".join(lines) + "\n")
            booted = run_process("--json", "qemu", "boot", timeout=300).json()
            assert booted["restored"] is True
            marker = in_guest(booted["name"], "cat", "/var/cache/deps/marker")
            seen[layer] = marker.stdout.strip() if marker.exit_code == 0 else None
            run_process("qemu", "stop", booted["name"])
        assert seen == {name: "cached", None: None}
    finally:
        import shutil

        shutil.rmtree(shared / "layers" / name, ignore_errors=True)


def test_a_plan_in_a_guest_runs_at_a_read_only_detached_head(
    forge, upgraded, guests_dir, tmp_path, monkeypatch, cli
):
    from tests.helpers import configure
    from tests.test_plan import MILESTONES

    config = configure(tmp_path, forge, monkeypatch)
    # A second provider replays the same scenario: the first backs off after its failure.
    replays = qemu_config(guests_dir).replace('["script"]', '["script", "codex"]')
    replays += '[provider_options.codex]\nscenario = "scenario.json"\n'
    config.write_text(replays + config.read_text())
    planned = {"result": {**RESULT, "summary": "Two steps", "milestones": MILESTONES}}
    trying = {"edits": {"calc.py": FIX}, **planned}
    # The first run tries to change the checkout, the second only plans.
    (tmp_path / "scenario.json").write_text(json.dumps({"phases": {"planning": [trying, planned]}}))
    forge.client("alice").add_labels("team", "app", 1, ["aiworker-plan"])
    assert cli("poll").exit_code == 0
    outcomes = []
    for _ in range(2):
        assert cli("--json", "claim", "--slot", "1").json()["claimed"]
        result = run_process("--json", "plan", "--task", "1", "--slot", "1", timeout=600)
        outcomes.append((result.json()["outcome"], result.json()["state"]))
    assert outcomes[0][1] == "ready", outcomes  # refused: the write failed, nothing posted
    assert outcomes[1] == ("planned", "awaiting_plan_approval"), outcomes
    assert query(upgraded, "select provider, outcome, reason from attempts order by id") == [
        ("script", "other", "script provider exited 1"),
        ("codex", "succeeded", "posted a plan of 2 milestones"),
    ]
    assert qemu_processes(str(guests_dir)) == []
