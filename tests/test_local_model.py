"""The local model route on a real llama-server (gemma-3-270m, Q4_K_M) with OpenCode
from npm: the gate's bounds, a route that reaches nothing but its server, and a simple
issue that gets one bounded local try, falls back and is delivered by the next provider."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest
import requests

from aiworker.config.models import LocalBounds as Bounds
from aiworker.runtime.model_gate import ModelGate
from tests.helpers import run_process
from tests.llama_fixtures import MODEL_ALIAS, NPM_BIN, REPO_ROOT, start_server
from tests.test_delivery import REVIEW_OK, deliver_until
from tests.test_implement import FIX, query, result_doc

pytestmark = pytest.mark.slow
COUNT = {"role": "user", "content": "Count from 1 to 1000, separated by commas."}


def chat(gate: ModelGate, **extra) -> requests.Response:
    body = {"model": MODEL_ALIAS, "messages": [COUNT], "temperature": 0, **extra}
    # Generous: the server may share two cores with guests and other tests' servers.
    return requests.post(f"{gate.url}/v1/chat/completions", json=body, timeout=900)


def test_the_gate_caps_every_request_and_ends_the_try_at_its_token_bound(llama_server):
    cancel = threading.Event()
    bounds = Bounds(tokens_per_request=24, tokens_per_try=30, requests_per_try=10)
    with ModelGate(llama_server.url, bounds, cancel) as gate:
        first = chat(gate, max_tokens=32000)  # what OpenCode asks for
        assert first.status_code == 200, first.text
        assert first.json()["usage"]["completion_tokens"] == 24
        assert first.json()["choices"][0]["finish_reason"] == "length"
        streamed = chat(gate, stream=True)
        events = [
            json.loads(line[6:])
            for line in streamed.text.splitlines()
            if line.startswith("data: {")
        ]
        assert events[-1]["usage"]["completion_tokens"] == 6  # what the try had left
        assert not cancel.is_set()
        third = chat(gate)
        assert third.status_code == 400
        assert third.json()["error"]["message"] == (
            "aiworker ended this local try: it reached the try's 30 generated tokens"
        )
        assert cancel.is_set()
        # Nothing but chat (and the model list) is on the route: no slot saves, no props.
        saved = requests.post(f"{gate.url}/slots/0?action=save", json={}, timeout=10)
        assert saved.status_code == 404
    use = gate.use
    assert (use.requests, use.generated_tokens, use.side_requests) == (2, 30, 2)
    assert use.exceeded == "the try's 30 generated tokens"
    assert llama_server.metrics()["tokens_predicted_total"] == 30  # the server's own count


def test_requests_at_once_share_the_try_s_tokens_and_none_outlives_the_gate(llama_server):
    """Tokens are reserved when a request is admitted: four requests at once, 40 each
    asked, share the try's 60; closing the gate cuts what is still relaying and admits
    nothing more."""
    cancel = threading.Event()
    bounds = Bounds(tokens_per_request=40, tokens_per_try=60, requests_per_try=10)
    gate = ModelGate(llama_server.url, bounds, cancel)
    replies: list[requests.Response] = []
    threads = [
        threading.Thread(target=lambda: replies.append(chat(gate, max_tokens=100)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(900)
    generated = sum(r.json()["usage"]["completion_tokens"] for r in replies if r.ok)
    assert generated == 60, [r.text[:200] for r in replies]
    assert sorted(r.status_code for r in replies) == [200, 200, 400, 400]
    idle = socket.create_connection(("127.0.0.1", int(gate.target.rsplit(":", 1)[1])))
    use = gate.close()
    with contextlib.suppress(OSError):  # a request sent after the end is not relayed
        late = json.dumps({"model": MODEL_ALIAS, "messages": [COUNT], "max_tokens": 50})
        head = f"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: {len(late)}\r\n\r\n"
        idle.sendall(head.encode() + late.encode())
        idle.recv(1024)
    idle.close()
    assert (use.generated_tokens, use.requests) == (60, 2)
    assert llama_server.metrics()["tokens_predicted_total"] == 60


@pytest.mark.skipif(
    shutil.which("strace") is None or os.geteuid() != 0, reason="needs strace and root"
)
def test_the_local_route_reaches_nothing_but_its_gate(llama_files, tmp_path, opencode_on_path):
    """In a network namespace with only loopback: OpenCode, as the llama adapter starts it,
    connects to the gate and nowhere else (no npm install of its plugin package, no model
    list, no title request), and its one request passes the gate to the server."""
    server, model = llama_files
    probe = subprocess.run(
        [
            *("unshare", "--net", "--", sys.executable, "-m", "tests.workers.local_route_probe"),
            *(str(server), str(model), str(tmp_path), str(NPM_BIN)),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    report = json.loads(probe.stdout.splitlines()[-1])
    assert report["reached"] == [report["gate"]], report
    assert report["use"]["requests"] >= 1, report
    assert report["use"]["side_requests"] == 0, report
    assert report["use"]["generated_tokens"] <= 64


BOUNDS = {
    "tokens_per_request": 128,
    "tokens_per_try": 384,
    "requests_per_try": 4,
    "seconds_per_try": 400,
    "context_tokens": 16000,
}


def _local_first(server_url: str, bounds: dict) -> str:
    table = "\n".join(f"{k} = {v}" for k, v in bounds.items())
    return (
        '\nproviders = ["llama", "script"]\n'
        f'[provider_options.llama]\nbase_url = "{server_url}"\n'
        f"[provider_options.llama.bounds]\n{table}\n"
        '[provider_options.script]\nscenario = "scenario.json"\n'
        '[phases.implementation.providers.llama]\nmodel = "gemma3-270m"\n'
        '[execution]\nbackend = "local"\n'
    )


@pytest.fixture
def simple_issue(forge):
    alice = forge.client("alice")
    alice.ensure_labels("team", "app", ["aiworker-simple"])
    alice.add_labels("team", "app", 1, ["aiworker-simple"])
    return alice


def test_a_simple_issue_gets_one_bounded_local_try_then_the_next_provider_delivers_it(
    claimed, simple_issue, upgraded, llama_server, opencode_on_path
):
    task = claimed(
        _local_first(llama_server.url, BOUNDS),
        edits={"calc.py": FIX},
        result=result_doc(),
        phases={"review": REVIEW_OK},
    )
    local = run_process("--json", "implement", "--task", str(task), "--slot", "1", timeout=600)
    report = local.json()
    assert (report["provider"], report["outcome"], report["state"]) == (
        "llama",
        "fell_back",
        "ready",
    ), report
    [(outcome, reason, settings)] = query(
        upgraded, "select outcome, reason, settings from attempts where provider = 'llama'"
    )
    use = json.loads(settings)["route_use"]
    assert 1 <= use["requests"] <= BOUNDS["requests_per_try"], use
    assert use["side_requests"] == 0, use  # no title or summary request of OpenCode's own
    assert 0 < use["generated_tokens"] <= BOUNDS["tokens_per_try"], use
    # Ended by the model, or by the gate at its time bound at the latest (a loaded machine
    # may need all of it): never later than the bound and the moment a kill takes.
    assert 0 < use["seconds"] <= BOUNDS["seconds_per_try"] + 30, use
    assert outcome in ("failed", "invalid", "other", "gate_failed", "not_accepted", "over_bound")
    assert report["reason"] == f"llama's local try ended {outcome}: {reason}"
    # The server generated what the gate let through, and nothing else: exactly, or, for
    # a try a bound ended (a request cut short there counts as all it was allowed, while
    # the server stops it where it was), no more.
    served = llama_server.metrics()["tokens_predicted_total"]
    if use["exceeded"] is None:
        assert served == use["generated_tokens"], use
    else:
        assert served <= use["generated_tokens"], use

    assert run_process("--json", "claim", "--slot", "1").json()["claimed"]
    second = run_process("--json", "implement", "--task", str(task), "--slot", "1").json()
    assert (second["provider"], second["outcome"]) == ("script", "implemented"), second
    assert second["decisions"][0] == {
        "provider": "llama",
        "eligible": False,
        "reason": "llama already had its one local try at this snapshot",
    }
    reports = deliver_until(task, "publish", "ci", "review", "merge")
    assert all(r.exit_code == 0 for r in reports.values()), reports
    assert query(upgraded, "select state from tasks") == [("done",)]
    assert query(upgraded, "select provider from attempts where phase = 'implementation'") == [
        ("llama",),
        ("script",),
    ]


@pytest.fixture
def endless_server(llama_files, tmp_path):
    """A server whose model never stops on its own (end-of-sequence ignored)."""
    server = start_server(llama_files, tmp_path, "--ignore-eos")
    yield server
    server.process.kill()
    server.process.wait()


def test_a_try_that_would_generate_without_end_is_stopped_at_its_time_bound(
    claimed, simple_issue, upgraded, endless_server, opencode_on_path
):
    """Every request may generate a great deal, and the model never stops: the try has
    10 s, then its process tree is killed and the attempt says why."""
    bounds = {**BOUNDS, "tokens_per_request": 100_000, "tokens_per_try": 1_000_000}
    bounds["seconds_per_try"] = 10
    task = claimed(_local_first(endless_server.url, bounds), edits={"calc.py": FIX}, result={})
    local = run_process("--json", "implement", "--task", str(task), "--slot", "1", timeout=300)
    report = local.json()
    assert (report["provider"], report["outcome"]) == ("llama", "fell_back"), report
    [(outcome, reason, settings)] = query(
        upgraded, "select outcome, reason, settings from attempts"
    )
    assert (outcome, reason) == ("over_bound", "the local try was stopped at the try's 10 s")
    use = json.loads(settings)["route_use"]
    assert use["exceeded"] == "the try's 10 s"
    assert use["seconds"] >= 10, use


GUEST_CHAT = """
import json, urllib.request
body = {"model": "gemma3-270m", "temperature": 0, "max_tokens": 32000,
        "messages": [{"role": "user", "content": "Count from 1 to 1000."}]}
asked = urllib.request.Request("http://10.0.2.101:8080/v1/chat/completions",
                               data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
with urllib.request.urlopen(asked, timeout=120) as reply:
    print(json.dumps(json.load(reply)["usage"]))
"""


def test_in_a_guest_the_model_forwarder_leads_to_the_gate(guests_dir, llama_server):
    """A guest booted for a local try reaches the model at its forwarder address, and
    that leads to the try's gate, not to the server: the request is capped and counted."""
    import shlex

    from aiworker.runtime.guests.backend import GuestSettings, QemuBackend, as_dev, proxy_env
    from aiworker.runtime.guests.egress import EgressPolicy
    from aiworker.runtime.guests.images import ImageStore
    from aiworker.runtime.guests.machine import MachineSpec

    store = ImageStore(guests_dir)
    image = store.current()
    machine = MachineSpec(**image.manifest()["machine"])
    backend = QemuBackend(
        store,
        image,
        "implementation",
        EgressPolicy(hosts=()),
        GuestSettings(machine=machine, model_target=llama_server.url.removeprefix("http://")),
    )
    bounds = Bounds(tokens_per_request=20, tokens_per_try=100)
    with ModelGate(llama_server.url, bounds, threading.Event()) as gate:
        backend.route_model(gate.target)
        session = backend.start_guest("implementation")
        try:
            done = session.shell.run(
                as_dev(f"python3 -c {shlex.quote(GUEST_CHAT)}", proxy_env(), cwd="/home/dev"),
                timeout=180,
            )
        finally:
            session.guest.stop()
            session.proxy.close()
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["completion_tokens"] == 20
    assert (gate.use.requests, gate.use.generated_tokens) == (1, 20)


def test_a_whole_reply_reaches_a_streaming_agent_as_events_with_its_tool_calls():
    """The gate asks the server for whole replies; an agent that asked for a stream
    reads the same message, tool calls, finish reason and usage as events."""
    from aiworker.runtime.model_gate import as_events

    reply = {
        "id": "chatcmpl-1",
        "created": 7,
        "model": MODEL_ALIAS,
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Reading the file.",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "read", "arguments": '{"path": "calc.py"}'},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    lines = as_events(reply).decode().split("\n\n")
    assert lines[-2:] == ["data: [DONE]", ""]
    first, last = (json.loads(line.removeprefix("data: ")) for line in lines[:2])
    delta = first["choices"][0]["delta"]
    assert delta["content"] == "Reading the file."
    assert delta["tool_calls"] == [{**reply["choices"][0]["message"]["tool_calls"][0], "index": 0}]
    assert last["choices"][0]["finish_reason"] == "tool_calls"
    assert last["usage"] == reply["usage"]
    assert {first["object"], last["object"]} == {"chat.completion.chunk"}
