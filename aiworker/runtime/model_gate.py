"""The route's gate: a loopback relay between a coding agent and a local model server
that enforces the try's bounds on the server's side of the route.

The agent (OpenCode) is not trusted to bound itself: it asks for 32,000 tokens per
request and retries on errors. Every chat request passes through here: the gate sets
`max_tokens` (and llama-server's `n_predict`) to what the request and the try may
still generate, counts requests and generated tokens from the server's own replies,
and refuses anything past a bound, past the try's deadline, or on any other route
(llama-server's slot and props writes among them). A refusal sets CANCEL, which ends
the agent's process tree: the try stops at its bound and says which.

The server is asked for whole replies; an agent that asked for a stream gets the reply
as events once it is complete. On a small host the agent and the model share the CPU,
and an agent handling every token as it comes slows the model down.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import urlsplit

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
MAX_BODY = 16 * 1024 * 1024  # a request's JSON: the prompt, the tools, the history
MAX_REPLY_BYTES = 16 * 1024 * 1024  # a reply: what a chat completion could ever be
KEPT_REFUSALS = 20
CLIENT_TIMEOUT_S = 10.0  # a client connection that sends nothing is dropped


class Bounds(Protocol):
    """A try's bounds (the configuration's `provider_options.llama.bounds`)."""

    @property
    def tokens_per_request(self) -> int: ...
    @property
    def tokens_per_try(self) -> int: ...
    @property
    def requests_per_try(self) -> int: ...
    @property
    def seconds_per_try(self) -> float: ...
    @property
    def context_tokens(self) -> int: ...


@dataclass
class RouteUse:
    """What one try used, as the server reported it; EXCEEDED names the bound that
    ended it (None: it ended on its own)."""

    requests: int = 0
    # Requests carrying no tools: a title or summary the agent asks for itself.
    side_requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    # From the try's start to its first request: the agent's own start-up.
    first_request_s: float | None = None
    # The server's own time on the try's prompts and generation (its reported timings).
    server_seconds: float = 0.0
    refused: list[str] = field(default_factory=list)
    exceeded: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ModelGate:
    def __init__(self, upstream: str, bounds: Bounds, cancel: threading.Event) -> None:
        parts = urlsplit(upstream)
        self.https = parts.scheme == "https"
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or (443 if self.https else 80)
        self.upstream_prefix = parts.path.rstrip("/")
        self.bounds = bounds
        self.cancel = cancel
        self.use = RouteUse()
        self.reserved = 0  # tokens admitted requests may still generate
        self.closed = False
        self.in_flight: set[socket.socket] = set()  # the upstream sockets, cut on close
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        # Handlers are joined on close: nothing they relay outlives the try's record.
        self.server.daemon_threads = False
        self.server.block_on_close = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def begin(self) -> None:
        """The try starts now: its wall time counts from here."""
        self.started = time.monotonic()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    def upstream(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return kind(self.upstream_host, self.upstream_port, timeout=self.remaining_s())

    def close(self) -> RouteUse:
        """Stop: no request is admitted any more, relays in flight are cut, every handler
        has ended; then what the try used, as a snapshot."""
        with self.lock:
            self.closed = True
            flying = list(self.in_flight)
        for sock in flying:
            # The socket itself: http.client lets go of HTTPConnection.sock once it hands
            # a reply that ends at close (no length) to its response.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.server.shutdown()
        self.server.server_close()  # joins the handlers
        with self.lock:
            self.use.seconds = round(time.monotonic() - self.started, 3)
            return RouteUse(**{**asdict(self.use), "refused": list(self.use.refused)})

    def __enter__(self) -> ModelGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def end(self, bound: str) -> None:
        """The try is over its BOUND: recorded once, and the agent is stopped."""
        with self.lock:
            if self.use.exceeded is None:
                self.use.exceeded = bound
        self.cancel.set()

    def admit(self, *, side: bool = False) -> tuple[int, str | None]:
        """Tokens the next request may generate (reserved until its reply is counted),
        or why it may not run at all (SIDE: a request of the agent's own)."""
        bounds = self.bounds
        with self.lock:
            if self.closed:
                return 0, "the end of the try"
            if self.use.exceeded is not None:
                return 0, self.use.exceeded
            if time.monotonic() - self.started >= bounds.seconds_per_try:
                return 0, f"the try's {bounds.seconds_per_try:g} s"
            if self.use.requests >= bounds.requests_per_try:
                return 0, f"the try's {bounds.requests_per_try} requests"
            left = bounds.tokens_per_try - self.use.generated_tokens - self.reserved
            if left <= 0:
                return 0, f"the try's {bounds.tokens_per_try} generated tokens"
            if self.use.first_request_s is None:
                self.use.first_request_s = round(time.monotonic() - self.started, 3)
            self.use.requests += 1
            self.use.side_requests += side
            allowed = min(bounds.tokens_per_request, left)
            self.reserved += allowed
            return allowed, None

    def count(self, allowed: int, prompt: int, generated: int) -> None:
        """A reply's use: its reservation of ALLOWED tokens becomes GENERATED."""
        with self.lock:
            self.reserved -= allowed
            self.use.prompt_tokens += prompt
            self.use.generated_tokens += generated
        if prompt > self.bounds.context_tokens:
            self.end(f"the {self.bounds.context_tokens}-token context")

    def refused(self, what: str) -> None:
        with self.lock:
            if len(self.use.refused) < KEPT_REFUSALS:
                self.use.refused.append(what[:300])

    def remaining_s(self) -> float:
        return max(1.0, self.bounds.seconds_per_try - (time.monotonic() - self.started))


def bounded(body: dict[str, Any], allowed: int) -> dict[str, Any]:
    """BODY with its generation capped at ALLOWED tokens (in every spelling the server
    reads), one completion per request, and asked for as one whole reply."""
    asked = [
        v
        for k in ("max_tokens", "max_completion_tokens", "n_predict")
        if isinstance(v := body.get(k), int) and v > 0
    ]
    cap = min([allowed, *asked])
    capped = {**body, "max_tokens": cap, "n_predict": cap, "n": 1, "n_cmpl": 1, "stream": False}
    capped.pop("max_completion_tokens", None)
    capped.pop("stream_options", None)
    return capped


def as_events(reply: dict[str, Any]) -> bytes:
    """A whole chat completion as the server-sent events a streaming client reads: one
    chunk with the message, one with the finish reason and the usage, then [DONE]."""
    choice = (reply.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    delta: dict[str, Any] = {"role": "assistant"}
    for key in ("content", "reasoning_content"):
        if message.get(key):
            delta[key] = message[key]
    if message.get("tool_calls"):
        delta["tool_calls"] = [{**c, "index": n} for n, c in enumerate(message["tool_calls"])]
    common = {
        "id": reply.get("id", "chatcmpl"),
        "object": "chat.completion.chunk",
        "created": reply.get("created", 0),
        "model": reply.get("model", ""),
    }
    chunks = [
        {**common, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {
            **common,
            "choices": [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}],
            "usage": reply.get("usage"),
        },
    ]
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def _usage_of(event: dict[str, Any]) -> tuple[int, int] | None:
    usage = event.get("usage")
    if isinstance(usage, dict) and "completion_tokens" in usage:
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    timings = event.get("timings")
    if isinstance(timings, dict) and "predicted_n" in timings:
        return int(timings.get("prompt_n") or 0), int(timings.get("predicted_n") or 0)
    return None


def _server_time(gate: ModelGate, event: dict[str, Any]) -> None:
    timings = event.get("timings")
    if isinstance(timings, dict) and "predicted_ms" in timings:
        spent = float(timings.get("prompt_ms") or 0) + float(timings.get("predicted_ms") or 0)
        with gate.lock:
            gate.use.server_seconds = round(gate.use.server_seconds + spent / 1000, 3)


def _read_reply(reply: http.client.HTTPResponse) -> bytes:
    """REPLY's body, whole (a reply cut short is IncompleteRead) and bounded."""
    data = bytearray()
    while chunk := reply.read(65536):
        data += chunk
        if len(data) > MAX_REPLY_BYTES:
            raise http.client.HTTPException(f"a reply over {MAX_REPLY_BYTES} bytes")
    if reply.length:  # what its Content-Length still promised when the connection ended
        raise http.client.IncompleteRead(bytes(data), reply.length)
    return bytes(data)


def _handler(gate: ModelGate) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection; a stream ends at close
        timeout = CLIENT_TIMEOUT_S

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            if self.path.split("?")[0] in ("/v1/models", "/models"):
                self._relay("GET", self.path, None, as_stream=False, allowed=0)
                return
            self._refuse(404, "this is not on the route")

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            if path not in CHAT_PATHS:
                self._refuse(404, "this is not on the route")
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length <= 0 or length > MAX_BODY:
                self._refuse(413, "the request body is missing or too large")
                return
            try:
                body = json.loads(self.rfile.read(length))
            except (ValueError, OSError):
                self._refuse(400, "the request body is not JSON")
                return
            body = body if isinstance(body, dict) else {}
            allowed, over = gate.admit(side=not body.get("tools"))
            if over is not None:
                gate.end(over)
                self._refuse(400, f"aiworker ended this local try: it reached {over}")
                return
            # The server generates the whole reply before the agent sees any of it: the
            # agent does no work per token while its model runs (they may share a CPU).
            capped = bounded(body, allowed)
            self._relay("POST", path, capped, as_stream=bool(body.get("stream")), allowed=allowed)

        def _refuse(self, status: int, message: str) -> None:
            gate.refused(f"{self.command} {self.path.split('?')[0]}: {message}")
            data = json.dumps({"error": {"message": message, "type": "invalid_request_error"}})
            self._send(status, "application/json", data.encode())

        def _send(self, status: int, kind: str, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _relay(
            self,
            method: str,
            path: str,
            body: dict[str, Any] | None,
            *,
            as_stream: bool,
            allowed: int,
        ) -> None:
            upstream = gate.upstream()
            raw: socket.socket | None = None
            sent = False
            try:
                upstream.connect()
                raw = upstream.sock
                with gate.lock:
                    if gate.closed:
                        raise ConnectionAbortedError("the gate is closing")
                    gate.in_flight.add(raw)
                payload = json.dumps(body).encode() if body is not None else None
                headers = {"Content-Type": "application/json"} if payload else {}
                upstream.request(method, gate.upstream_prefix + path, payload, headers)
                sent = True
                reply = upstream.getresponse()
                status, kind = reply.status, reply.getheader("Content-Type") or "application/json"
                data = _read_reply(reply)
            except (OSError, http.client.HTTPException) as exc:
                if isinstance(exc, TimeoutError):
                    gate.end(f"the try's {gate.bounds.seconds_per_try:g} s")
                if body is not None:  # cut short once sent: it may have generated it all
                    gate.count(allowed, 0, allowed if sent else 0)
                with contextlib.suppress(OSError):
                    self._refuse(502, f"the model server did not answer: {type(exc).__name__}")
                return
            finally:
                with gate.lock:
                    gate.in_flight.discard(raw)
                upstream.close()
            try:
                event = json.loads(data)
            except ValueError:
                event = None
            event = event if isinstance(event, dict) else {}
            if body is not None:
                # A reply without its usage counts as all it may generate, unless it is a
                # refusal (4xx, 5xx): that generated nothing.
                prompt, generated = _usage_of(event) or (0, allowed if status < 400 else 0)
                _server_time(gate, event)
                gate.count(allowed, prompt, generated)
            with contextlib.suppress(OSError):  # the agent may be gone (ended at a bound)
                if as_stream and status == 200 and event:
                    self._send(status, "text/event-stream", as_events(event))
                else:
                    self._send(status, kind, data)

    return Handler
