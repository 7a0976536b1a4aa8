"""The parts of the qemu backend that run without QEMU: the egress proxy on real sockets,
the image store's pruning, the sweep of dead guests, the credential lease of the local
backend, provisioning's refusals, and a qemu backend with nothing provisioned."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from aiworker.runtime.guests.egress import DecisionLog, EgressPolicy, EgressProxy, decide
from aiworker.runtime.guests.guest import sweep_guests
from aiworker.runtime.guests.images import ImageStore
from tests.helpers import run_process

FIX = "def add(a, b):\n    return a + b\n"
RESULT = {
    "contract": "ait.agent.result.v1",
    "completion": "complete",
    "summary": "Fixed add()",
    "validation": [{"check_id": "ci", "command": ["./ci/run"], "exit_code": 0}],
}


def test_the_policy_admits_allowlisted_public_names_only():
    policy = EgressPolicy(hosts=("deb.debian.org", "*.pypi.org", "localhost"))
    assert not decide(policy, "deb.debian.org", 22).allowed  # ports 80 and 443 only
    assert "not on the allowlist" in decide(policy, "example.org", 443).reason
    assert not decide(policy, "pypi.org", 443).allowed  # "*.pypi.org" is subdomains only
    assert not decide(policy, "evil-pypi.org", 443).allowed
    # A listed name that resolves to loopback is refused after resolution.
    refused = decide(policy, "localhost", 80)
    assert not refused.allowed
    assert "resolves to a non-public address" in refused.reason
    # Addresses: private, link-local (metadata) and shared ranges are never reached...
    literal = EgressPolicy(
        hosts=("10.1.2.3", "169.254.169.254", "100.64.0.1", "2002:a01:203::1", "8.8.8.8")
    )
    for private in ("10.1.2.3", "169.254.169.254", "100.64.0.1", "2002:a01:203::1"):
        assert not decide(literal, private, 80).allowed, private
    assert decide(literal, "8.8.8.8", 443).allowed
    # ...unless the operator trusts that network; the metadata address never.
    trusted = EgressPolicy(
        hosts=("10.1.2.3", "169.254.169.254"), trusted=("10.0.0.0/8", "169.254.0.0/16")
    )
    assert decide(trusted, "10.1.2.3", 80).allowed
    assert not decide(trusted, "169.254.169.254", 80).allowed


class _Upstream(BaseHTTPRequestHandler):
    def do_GET(self):
        body = (
            f"path={self.path} host={self.headers.get('Host')} "
            f"proxy-auth={self.headers.get('Proxy-Authorization')}"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(request)
        data = b""
        while chunk := client.recv(4096):
            data += chunk
        return data


def test_the_proxy_forwards_http_and_tunnels_connect_and_logs_every_decision(tmp_path):
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = upstream.server_address[1]
    log = tmp_path / "egress.jsonl"
    policy = EgressPolicy(hosts=("127.0.0.1",), trusted=("127.0.0.1/32",), ports=(port,))
    proxy = EgressProxy(policy, DecisionLog(log, "implementation"))
    try:
        plain = _exchange(
            proxy.port,
            f"GET http://127.0.0.1:{port}/x?y=1 HTTP/1.1\r\nHost: other.example\r\n"
            "Proxy-Authorization: Basic c2VjcmV0\r\n\r\n".encode(),
        )
        assert plain.startswith(b"HTTP/1.0 200")
        # Origin-form upstream with the decided host's own Host (not the client's), and
        # the proxy's own headers not passed on.
        assert plain.endswith(f"path=/x?y=1 host=127.0.0.1:{port} proxy-auth=None".encode())
        # One request per connection: a second one pipelined behind it goes nowhere.
        pipelined = _exchange(
            proxy.port,
            f"GET http://127.0.0.1:{port}/a HTTP/1.1\r\nHost: h\r\n\r\n"
            "GET http://127.0.0.1/b HTTP/1.1\r\nHost: other.example\r\n\r\n".encode(),
        )
        assert pipelined.count(b"HTTP/1.0 200") == 1
        assert b"path=/b" not in pipelined
        tunnel = _exchange(
            proxy.port,
            f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
            "GET /t HTTP/1.0\r\n\r\n".encode(),
        )
        assert tunnel.startswith(b"HTTP/1.1 200 Connection Established\r\n\r\nHTTP/1.0 200")
        assert tunnel.endswith(b"path=/t host=None proxy-auth=None")
        refused = _exchange(
            proxy.port, f"CONNECT 10.9.9.9:{port} HTTP/1.1\r\nHost: 10.9.9.9\r\n\r\n".encode()
        )
        assert refused.startswith(b"HTTP/1.1 403")
        assert b"10.9.9.9 is not on the allowlist" in refused
        for bad in (b"nonsense", b"CONNECT h:\xc2\xb2 HTTP/1.1", b"GET http://h:99999/ HTTP/1.1"):
            assert _exchange(proxy.port, bad + b"\r\n\r\n").startswith(b"HTTP/1.1 400"), bad
    finally:
        proxy.close()
        upstream.shutdown()
        upstream.server_close()
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(d["method"], d["host"], d["allowed"]) for d in logged] == [
        ("GET", "127.0.0.1", True),
        ("GET", "127.0.0.1", True),
        ("CONNECT", "127.0.0.1", True),
        ("CONNECT", "10.9.9.9", False),
    ]
    assert {d["phase"] for d in logged} == {"implementation"}


class _Counting(BaseHTTPRequestHandler):
    """An origin that records every request it gets, with its body."""

    seen: list[tuple[str, bytes]] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        _Counting.seen.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST

    def log_message(self, *args):
        pass


SMUGGLING = {
    "two equal Content-Lengths": b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    "two Content-Lengths": b"Content-Length: 5\r\nContent-Length: 30\r\n\r\nhello",
    "a listed Content-Length": b"Content-Length: 5, 30\r\n\r\nhello",
    "CL.TE": b"Content-Length: 36\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    b"GET http://H/x HTTP/1.1\r\nX: y",
    "TE.CL": b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
    "an obfuscated TE": b"Transfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\nhello",
    "obsolete line folding": b"X-A: 1\r\n Content-Length: 30\r\nContent-Length: 5\r\n\r\nhello",
    "a bare LF": b"X-A: 1\nContent-Length: 30\r\nContent-Length: 5\r\n\r\nhello",
    "a bare CR": b"X-A: 1\rContent-Length: 30\r\n\r\nhello",
    "a NUL in a value": b"X-A: a\x00b\r\nContent-Length: 5\r\n\r\nhello",
    "a space in a name": b"Content Length: 5\r\n\r\nhello",
}


def test_request_smuggling_shapes_are_refused_and_never_reach_the_origin(tmp_path):
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = upstream.server_address[1]
    policy = EgressPolicy(hosts=("127.0.0.1",), trusted=("127.0.0.1/32",), ports=(port,))
    log = tmp_path / "egress.jsonl"
    proxy = EgressProxy(policy, DecisionLog(log, "implementation"))
    _Counting.seen = []
    line = f"POST http://127.0.0.1:{port}/p HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    try:
        for name, rest in SMUGGLING.items():
            answer = _exchange(proxy.port, line + rest)
            assert answer.startswith(b"HTTP/1.1 400"), (name, answer)
        no_host = f"GET http://127.0.0.1:{port}/p HTTP/1.1\r\n\r\n".encode()
        assert _exchange(proxy.port, no_host).startswith(b"HTTP/1.1 400")
        huge = line + b"X-Pad: " + b"a" * 70_000 + b"\r\n\r\n"
        assert _exchange(proxy.port, huge).startswith(b"HTTP/1.1 400")
        chunked = line + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        assert _exchange(proxy.port, chunked).startswith(b"HTTP/1.1 411")
        assert _Counting.seen == []  # not one of them reached the origin
        assert not log.exists() or log.read_text() == ""  # refused before any decision
        # A well-formed one goes through once, with exactly its declared body, and what
        # follows it on the connection goes nowhere.
        good = line + b"Content-Length: 5\r\n\r\nhelloPOST http://127.0.0.1/q HTTP/1.1\r\n\r\n"
        assert _exchange(proxy.port, good).startswith(b"HTTP/1.0 200")
        assert _Counting.seen == [("/p", b"hello")]
    finally:
        proxy.close()
        upstream.shutdown()
        upstream.server_close()


def test_what_a_guest_asks_for_cannot_grow_the_decision_log_without_bound(tmp_path, monkeypatch):
    """A guest that asks for a 16 KB name over and over gets each refusal logged with the
    name cut, and the log rotates past its size: the host's disk is not the guest's."""
    from aiworker.runtime.guests import egress
    from aiworker.runtime.logfiles import Rotation

    monkeypatch.setattr(egress, "LOG_ROTATION", Rotation(40_000, keep=2))
    log = tmp_path / "egress.jsonl"
    proxy = EgressProxy(EgressPolicy(hosts=("allowed.example",)), DecisionLog(log, "test"))
    name = b"a" * 16_000
    try:
        for _ in range(150):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
                client.sendall(b"CONNECT " + name + b":443 HTTP/1.1\r\nHost: x\r\n\r\n")
                assert client.recv(100).startswith(b"HTTP/1.1 403")
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
            line = b"M" * 12_000 + b" http://b.example/ HTTP/1.1\r\nHost: b.example\r\n\r\n"
            client.sendall(line)  # a method of the guest's making
            assert client.recv(100).startswith(b"HTTP/1.1 403")
    finally:
        proxy.close()
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["egress.jsonl", "egress.jsonl.1", "egress.jsonl.2"]
    assert sum((tmp_path / k).stat().st_size for k in kept) < 3 * 40_000 + 2_000
    *_, cut, method = (json.loads(line) for line in log.read_text().splitlines())
    assert method["method"] == "M" * 31 + "…"
    entry = cut
    assert entry["host"] == "a" * 254 + "…"
    assert entry["allowed"] is False
    assert len(entry["reason"]) <= 512


def _image(store: ImageStore, name: str, manifest: bool = True) -> None:
    path = store.images_dir / name
    path.mkdir(parents=True)
    if manifest:
        (path / "manifest.json").write_text("{}")


def test_pruning_keeps_the_current_image_those_guests_use_and_those_being_built(tmp_path):
    store = ImageStore(tmp_path / "guests")
    store.ensure()
    for name in ("img-a", "img-b", "img-c"):
        _image(store, name)
    _image(store, "img-building", manifest=False)
    (store.run_dir / "g1").mkdir()
    (store.run_dir / "g1" / "guest.json").write_text(json.dumps({"image": "img-a"}))
    from aiworker.runtime.guests.images import Image

    store.publish(Image(store.images_dir / "img-c"))
    assert store.current().name == "img-c"
    assert store.prune() == ["img-b"]
    assert sorted(p.name for p in store.images_dir.iterdir()) == ["img-a", "img-building", "img-c"]


def test_the_sweep_removes_guests_whose_owner_died_and_keeps_live_ones(tmp_path):
    store = ImageStore(tmp_path / "guests")
    store.ensure()
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    records = {
        "orphaned": {"pid": dead, "owner_pid": dead, "image": "i"},
        "live": {"pid": os.getpid(), "owner_pid": os.getpid(), "image": "i"},
        "operator-exited": {"pid": dead, "owner_pid": None, "image": "i"},
    }
    for name, record in records.items():
        (store.run_dir / name).mkdir()
        (store.run_dir / name / "overlay.qcow2").write_bytes(b"x")
        (store.run_dir / name / "guest.json").write_text(json.dumps(record))
    assert sorted(sweep_guests(store)) == ["operator-exited", "orphaned"]
    assert [p.name for p in store.run_dir.iterdir()] == ["live"]


def test_the_sweep_leaves_a_guest_being_started_to_the_process_starting_it(tmp_path):
    """A phase's guest is recorded before its overlay is made and QEMU spawned (no pid
    yet): a `qemu list` or tick sweeping then must not remove it from under its starter
    (it did, under load: the phase failed with guest.json.tmp missing)."""
    from aiworker.runtime.guests.guest import Guest, StartOptions
    from aiworker.runtime.guests.images import Image

    store = ImageStore(tmp_path / "guests")
    store.ensure()
    _image(store, "img-a")
    starting = Guest(store, Image(store.images_dir / "img-a"), "implementati-0001")
    starting.path.mkdir()
    starting._record(StartOptions(purpose="implementation", proxy_port=1))
    record = json.loads((starting.path / "guest.json").read_text())
    assert record["pid"] is None
    assert record["starter_pid"] == os.getpid()
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    (store.run_dir / "abandoned-start").mkdir()
    (store.run_dir / "abandoned-start" / "guest.json").write_text(
        json.dumps({**record, "starter_pid": dead, "owner_pid": dead})
    )
    exited = {**record, "pid": dead, "owner_pid": os.getpid()}  # QEMU gone, owner not
    (store.run_dir / "exited-owned").mkdir()
    (store.run_dir / "exited-owned" / "guest.json").write_text(json.dumps(exited))
    assert sweep_guests(store) == ["abandoned-start"]
    assert sorted(p.name for p in store.run_dir.iterdir()) == ["exited-owned", "implementati-0001"]
    # A start that never got its QEMU for STARTING_S is swept even if its pid runs.
    from aiworker.runtime.guests import guest as guest_module

    old = time.time() - guest_module.STARTING_S - 1
    os.utime(starting.path, (old, old))
    os.utime(store.run_dir / "exited-owned", (old, old))
    assert sorted(sweep_guests(store)) == ["exited-owned", "implementati-0001"]
    starting.path.mkdir()
    starting._record(StartOptions(purpose="implementation", proxy_port=1))  # still its


def _query(db, sql):
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def _lent(home) -> str:
    return (
        'providers = ["script"]\n[provider_options.script]\nscenario = "scenario.json"\n'
        f'home = "{home}"\n'
    )


@pytest.mark.parametrize(
    ("account", "adopted"), [("acct-1", True), ("acct-2", False)], ids=["same", "other"]
)
def test_a_lent_login_comes_back_only_for_the_same_identity(
    claimed, upgraded, state_dir, tmp_path, account, adopted
):
    login = tmp_path / "login"
    login.mkdir()
    before = json.dumps({"tokens": {"account_id": "acct-1", "access_token": "old"}})
    (login / "auth.json").write_text(before)
    after = json.dumps({"tokens": {"account_id": account, "access_token": "new"}})
    task = claimed(
        _lent(login),
        edits={"calc.py": FIX},
        result=RESULT,
        home_files={"auth.json": after, "notes.txt": "written in the run's home"},
    )
    done = run_process("--json", "implement", "--task", str(task), "--slot", "1", timeout=120)
    assert done.json()["outcome"] == "implemented", done
    assert (login / "auth.json").read_text() == (after if adopted else before)
    # Only credentials come back; the run's copy of the home is gone with the workspace.
    assert sorted(p.name for p in login.iterdir()) == ["auth.json"]
    assert list((state_dir / "workspaces").iterdir()) == []


def test_a_qemu_backend_with_no_image_refunds_the_attempt_and_says_why(claimed, upgraded):
    config = (
        'providers = ["script"]\n[provider_options.script]\nscenario = "scenario.json"\n'
        '[execution]\nbackend = "qemu"\n'
    )
    task = claimed(config, edits={"calc.py": FIX}, result=RESULT)
    done = run_process("--json", "implement", "--task", str(task), "--slot", "1")
    assert done.exit_code == 75, done
    assert _query(upgraded, "select outcome, refunded, reason from attempts") == [
        (
            "unavailable",
            1,
            "execution.backend is qemu, but no guest image is provisioned: "
            "run `aiworker qemu provision`",
        )
    ]
    assert _query(upgraded, "select state from tasks") == [("ready",)]


def test_booting_or_layering_with_no_image_asks_the_operator_to_provision(cli, tmp_path):
    """No image is provisioned: `qemu boot` and `qemu layer` say what to run, and exit 2
    (the operator's to act on), not 75, which a unit would take as a wait that passes."""
    script = tmp_path / "layer.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    for argv in (("qemu", "boot"), ("qemu", "layer", "deps", "--script", str(script))):
        refused = cli("--json", *argv)
        assert refused.exit_code == 2, refused
        assert refused.json()["error"] == {
            "code": "not_provisioned",
            "message": "no guest image is provisioned: run `aiworker qemu provision`",
        }
