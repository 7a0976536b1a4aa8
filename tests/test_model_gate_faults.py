"""The local model's gate against a model server that misbehaves in ways a real one
does only under faults (a reply trickling in and ending at close, an error reply): the
try still ends when the phase closes the gate, and nothing is counted that was not
generated. The real llama-server's bounds are in test_local_model.py."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import requests

from aiworker.config.models import LocalBounds
from aiworker.runtime.model_gate import ModelGate

REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@contextlib.contextmanager
def serving(answer) -> Iterator[str]:
    """A server on loopback that runs ANSWER(connection) for each request it gets, for
    the block's length: then it stops listening (shutdown wakes the accepting thread, so
    that no later test's connection lands here) and its threads end."""
    listener = socket.create_server(("127.0.0.1", 0))
    handlers: list[threading.Thread] = []

    def guarded(connection: socket.socket) -> None:
        with connection, contextlib.suppress(OSError, ValueError, StopIteration):
            answer(connection)

    def loop() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            handler = threading.Thread(target=guarded, args=(connection,), daemon=True)
            handlers.append(handler)
            handler.start()

    accepting = threading.Thread(target=loop, daemon=True)
    accepting.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        accepting.join(10)
        for handler in handlers:
            handler.join(30)


def read_request(connection: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            raise ValueError("the request ended early")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += connection.recv(65536)


def test_a_reply_that_trickles_in_and_ends_at_close_is_cut_when_the_try_ends():
    """http.client hands the socket of a reply that ends at close to the response and
    forgets it: the gate cuts the socket itself, so closing it ends the relay."""
    reply = json.dumps({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 9}})

    def trickle(connection: socket.socket) -> None:
        read_request(connection)
        head = f"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: {len(reply)}\r\n\r\n"
        connection.sendall(head.encode())
        for byte in reply.encode():  # a byte at a time: no read ever times out
            connection.sendall(bytes([byte]))  # until the gate cuts it (OSError)
            time.sleep(0.5)

    got: list[object] = []
    with serving(trickle) as upstream:
        gate = ModelGate(upstream, LocalBounds(seconds_per_try=60), threading.Event())

        def agent() -> None:
            try:
                url = f"{gate.url}/v1/chat/completions"
                got.append(requests.post(url, json=REQUEST, timeout=60))
            except requests.RequestException as exc:
                got.append(exc)

        asking = threading.Thread(target=agent)
        asking.start()
        time.sleep(2)  # the reply has begun to arrive
        started = time.monotonic()
        use = gate.close()  # what the phase does when the try's time is up
        closed_in = time.monotonic() - started
        asking.join(60)
    assert closed_in < 10, f"closing the gate took {closed_in:.0f} s"
    assert use.requests == 1
    [answer] = got
    assert isinstance(answer, requests.RequestException) or answer.status_code == 502


def test_an_error_reply_generated_nothing():
    """A 500 with no usage in it is not counted as all the request could generate: the
    try's tokens are not spent by a server that refuses, and its end says why."""

    def refuse(connection: socket.socket) -> None:
        read_request(connection)
        body = b'{"error": {"message": "the model is loading"}}'
        head = f"HTTP/1.1 500 Internal Server Error\r\nContent-Length: {len(body)}\r\n\r\n"
        connection.sendall(head.encode() + body)

    bounds = LocalBounds(tokens_per_request=1024, tokens_per_try=2048, requests_per_try=10)
    with serving(refuse) as upstream, ModelGate(upstream, bounds, threading.Event()) as gate:
        for _ in range(4):
            answer = requests.post(f"{gate.url}/v1/chat/completions", json=REQUEST, timeout=60)
            assert answer.status_code == 500
    assert (gate.use.requests, gate.use.generated_tokens, gate.use.exceeded) == (4, 0, None)
