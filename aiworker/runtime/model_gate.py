"""The route's gate: a loopback relay between a coding agent and a local model server
that enforces the try's bounds on the server's side of the route.

The agent (OpenCode) is not trusted to bound itself: it asks for 32,000 tokens per
request and retries on errors. Every chat request passes through here: the gate sets
`max_tokens` (and llama-server's `n_predict`) to what the request and the try may
still generate, counts requests and generated tokens from the server's own replies,
and refuses anything past a bound, past the try's deadline, or on any other route
(llama-server's slot and props writes among them). A refusal sets CANCEL, which ends
the agent's process tree: the try stops at its bound and says which.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
MAX_BODY = 16 * 1024 * 1024  # a request's JSON: the prompt, the tools, the history


@dataclass(frozen=True)
class Bounds:
    tokens_per_request: int = 1024
    tokens_per_try: int = 8192
    requests_per_try: int = 24
    seconds_per_try: float = 900.0
    context_tokens: int = 16384


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
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or (443 if parts.scheme == "https" else 80)
        self.upstream_prefix = parts.path.rstrip("/")
        self.bounds = bounds
        self.cancel = cancel
        self.use = RouteUse()
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
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

    def close(self) -> RouteUse:
        self.server.shutdown()
        self.server.server_close()
        self.use.seconds = round(time.monotonic() - self.started, 3)
        return self.use

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
        """Tokens the next request may generate, or why it may not run at all (SIDE: a
        request of the agent's own, counted apart as well)."""
        bounds = self.bounds
        with self.lock:
            if self.use.exceeded is not None:
                return 0, self.use.exceeded
            if time.monotonic() - self.started >= bounds.seconds_per_try:
                return 0, f"the try's {bounds.seconds_per_try:g} s"
            if self.use.requests >= bounds.requests_per_try:
                return 0, f"the try's {bounds.requests_per_try} requests"
            left = bounds.tokens_per_try - self.use.generated_tokens
            if left <= 0:
                return 0, f"the try's {bounds.tokens_per_try} generated tokens"
            if self.use.first_request_s is None:
                self.use.first_request_s = round(time.monotonic() - self.started, 3)
            self.use.requests += 1
            self.use.side_requests += side
            return min(bounds.tokens_per_request, left), None

    def count(self, prompt: int, generated: int) -> None:
        with self.lock:
            self.use.prompt_tokens += prompt
            self.use.generated_tokens += generated
        if prompt > self.bounds.context_tokens:
            self.end(f"the {self.bounds.context_tokens}-token context")

    def remaining_s(self) -> float:
        return max(1.0, self.bounds.seconds_per_try - (time.monotonic() - self.started))


def bounded(body: dict[str, Any], allowed: int) -> dict[str, Any]:
    """BODY with its generation capped at ALLOWED tokens (in every spelling the server
    reads) and usage reported at the end of a stream."""
    asked = [
        v
        for k in ("max_tokens", "max_completion_tokens", "n_predict")
        if isinstance(v := body.get(k), int) and v > 0
    ]
    cap = min([allowed, *asked])
    capped = {**body, "max_tokens": cap, "n_predict": cap}
    capped.pop("max_completion_tokens", None)
    if capped.get("stream"):
        capped["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return capped


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


def _handler(gate: ModelGate) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection; a stream ends at close

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            if self.path.split("?")[0] in ("/v1/models", "/models"):
                self._relay("GET", self.path, None, stream=False, allowed=0)
                return
            self._refuse(404, f"{self.path} is not on the route")

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            if path not in CHAT_PATHS:
                self._refuse(404, f"{path} is not on the route")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY:
                self._refuse(413, "the request body is missing or too large")
                return
            try:
                body = json.loads(self.rfile.read(length))
            except ValueError:
                self._refuse(400, "the request body is not JSON")
                return
            body = body if isinstance(body, dict) else {}
            allowed, over = gate.admit(side=not body.get("tools"))
            if over is not None:
                gate.end(over)
                self._refuse(400, f"aiworker ended this local try: it reached {over}")
                return
            capped = bounded(body, allowed)
            self._relay("POST", path, capped, stream=bool(capped.get("stream")), allowed=allowed)

        def _refuse(self, status: int, message: str) -> None:
            with gate.lock:
                gate.use.refused.append(f"{self.command} {self.path.split('?')[0]}: {message}")
            data = json.dumps({"error": {"message": message, "type": "invalid_request_error"}})
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data.encode())

        def _relay(
            self, method: str, path: str, body: dict[str, Any] | None, *, stream: bool, allowed: int
        ) -> None:
            upstream = http.client.HTTPConnection(
                gate.upstream_host, gate.upstream_port, timeout=gate.remaining_s()
            )
            try:
                payload = json.dumps(body).encode() if body is not None else None
                headers = {"Content-Type": "application/json"} if payload else {}
                upstream.request(method, gate.upstream_prefix + path, payload, headers)
                reply = upstream.getresponse()
                self.send_response(reply.status)
                for name in ("Content-Type", "Cache-Control"):
                    if reply.getheader(name):
                        self.send_header(name, reply.getheader(name) or "")
                self.end_headers()
                seen = self._pass_stream(reply) if stream else self._pass_whole(reply)
            except (OSError, http.client.HTTPException) as exc:
                if isinstance(exc, TimeoutError):
                    gate.end(f"the try's {gate.bounds.seconds_per_try:g} s")
                if body is not None:  # the server may have generated all it was allowed
                    gate.count(0, allowed)
                with contextlib.suppress(OSError):
                    self._refuse(502, f"the model server did not answer: {type(exc).__name__}")
                return
            finally:
                upstream.close()
            if body is not None:
                prompt, generated = seen or (0, 0)
                gate.count(prompt, min(generated, allowed) if allowed else generated)

        def _pass_whole(self, reply: http.client.HTTPResponse) -> tuple[int, int] | None:
            data = reply.read()
            self.wfile.write(data)
            try:
                event = json.loads(data)
            except ValueError:
                return None
            if not isinstance(event, dict):
                return None
            _server_time(gate, event)
            return _usage_of(event)

        def _pass_stream(self, reply: http.client.HTTPResponse) -> tuple[int, int] | None:
            seen = None
            chunks = 0
            while line := reply.readline():
                self.wfile.write(line)
                self.wfile.flush()
                if not line.startswith(b"data: {"):
                    continue
                try:
                    event = json.loads(line[6:])
                except ValueError:
                    continue
                chunks += 1
                seen = _usage_of(event) or seen
                _server_time(gate, event)
            return seen or (0, chunks)

    return Handler
