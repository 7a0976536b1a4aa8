"""The guests' only way out: an HTTP proxy on the host (CONNECT and plain HTTP) that
admits allowlisted names on ports 80 and 443, resolves them itself and refuses any that
resolve to an address that is not global (private, loopback, link-local, metadata,
shared, reserved), tunnels TLS without looking into it, and logs every decision.

An operator may trust networks explicitly (`trusted`: an internal mirror); nothing
else that is not global is ever reached, whatever name points at it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import select
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import h11

from aiworker.runtime.logfiles import Rotation, rotate

log = logging.getLogger("aiworker.egress")
PORTS = (80, 443)
HEAD_LIMIT = 16 * 1024
LOG_ROTATION = Rotation(16 * 1024 * 1024, keep=2)  # egress.jsonl and two older ones
IDLE_S = 300.0
HEAD_DEADLINE_S = 15.0
MAX_CONNECTIONS = 64  # per proxy (one guest): more wait for none, they are refused
METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
# Global by the standard library, yet they lead to IPv4 addresses that may not be:
# 6to4 and NAT64 are refused whatever they embed.
TRANSLATED = (
    ipaddress.ip_network("2002::/16"),
    ipaddress.ip_network("64:ff9b::/96"),
    ipaddress.ip_network("64:ff9b:1::/48"),
)
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class EgressPolicy:
    hosts: tuple[str, ...] = ()  # exact names, "*.suffix", or literal addresses
    trusted: tuple[str, ...] = ()  # networks (CIDR) the operator allows although private
    ports: tuple[int, ...] = PORTS

    def allows_name(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        for listed in self.hosts:
            entry = listed.lower().rstrip(".")
            if entry.startswith("*.") and host.endswith(entry[1:]) and host != entry[2:]:
                return True
            if host == entry:
                return True
        return False

    def allows_address(self, address: Address) -> bool:
        if address in METADATA:
            return False
        if any(address in ipaddress.ip_network(net, strict=False) for net in self.trusted):
            return True
        return address.is_global and not any(address in net for net in TRANSLATED)


@dataclass
class Decision:
    allowed: bool
    reason: str
    addresses: tuple[str, ...] = ()

    @property
    def address(self) -> str | None:
        return self.addresses[0] if self.addresses else None


def decide(policy: EgressPolicy, host: str, port: int) -> Decision:
    """Whether HOST:PORT may be reached, and at which addresses (resolved here, once:
    the connection goes to an address checked now, never to a name resolved again)."""
    if port not in policy.ports:
        return Decision(False, f"port {port} is not allowed (only {policy.ports})")
    if not policy.allows_name(host):
        return Decision(False, f"{host} is not on the allowlist")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    except (OSError, UnicodeError, ValueError) as exc:
        return Decision(False, f"{host} does not resolve: {exc}")
    if not addresses:
        return Decision(False, f"{host} resolves to nothing")
    refused = [str(a) for a in addresses if not policy.allows_address(a)]
    if refused:
        return Decision(False, f"{host} resolves to a non-public address ({refused[0]})")
    return Decision(True, "allowlisted", tuple(dict.fromkeys(str(a) for a in addresses)))


@dataclass
class DecisionLog:
    path: Path | None
    phase: str
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, method: str, host: str, port: int, decision: Decision) -> None:
        # The guest chose the method and the host (a name is at most 253 characters):
        # what is longer is cut, so that refused requests cannot fill the host's disk.
        method, host, reason = _cut(method, 32), _cut(host, 255), _cut(decision.reason, 512)
        entry = {
            "at": time.time(),
            "phase": self.phase,
            "method": method,
            "host": host,
            "port": port,
            "allowed": decision.allowed,
            "reason": reason,
            "address": decision.address,
        }
        verdict = "allowed" if decision.allowed else "refused"
        log.info("egress %s %s:%d %s: %s", method, host, port, verdict, reason)
        if self.path is not None:
            with self.lock:
                rotate(self.path, LOG_ROTATION)  # all guests write it, for as long as they run
                with self.path.open("a") as handle:
                    handle.write(json.dumps(entry) + "\n")


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def _relay(a: socket.socket, b: socket.socket) -> None:
    sockets = [a, b]
    while True:
        ready, _, _ = select.select(sockets, [], [], IDLE_S)
        if not ready:
            return
        for source in ready:
            data = source.recv(65536)
            if not data:
                return
            (b if source is a else a).sendall(data)


class Refusal(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass
class Request:
    method: str
    host: str
    port: int
    head: bytes  # what goes upstream for plain HTTP (rewritten), empty for CONNECT
    body_bytes: int  # how many bytes of body follow the head (plain HTTP)
    rest: bytes  # what the client sent after its head


def _read_head(client: socket.socket) -> tuple[bytes, bytes]:
    deadline = time.monotonic() + HEAD_DEADLINE_S
    head = b""
    while b"\r\n\r\n" not in head:
        client.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = client.recv(4096)
        if not chunk or len(head) > HEAD_LIMIT or time.monotonic() > deadline:
            raise Refusal(400, "incomplete or oversized request head")
        head += chunk
    header, _, rest = head.partition(b"\r\n\r\n")
    return header, rest


def parse(header: bytes, rest: bytes) -> Request:
    """The request line and headers, read by h11 (a maintained HTTP/1.1 parser) after the
    shapes that smuggle a second request past a proxy are refused (bare CR or LF, folded
    lines, a duplicated or listed Content-Length, Transfer-Encoding); plain HTTP is
    rewritten for the origin: its own Host, no proxy headers, one request (Connection:
    close), no chunked bodies."""
    _refuse_ambiguous(header)
    event = _h11_request(header)
    method = event.method.decode("ascii")
    target = event.target.decode("ascii")
    try:
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            host = host.strip("[]")
            if not host or not port_text.isascii() or not port_text.isdecimal():
                raise ValueError(target)
            return Request(method, host, int(port_text), b"", 0, rest)
        url = urlsplit(target)
        if url.scheme != "http" or not url.hostname:
            raise Refusal(400, "only absolute http:// URLs and CONNECT")
        host, port = url.hostname, url.port or 80
    except ValueError as exc:
        raise Refusal(400, f"malformed request line: {exc}") from None
    fields = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in event.headers.raw_items()]
    length = next((v for n, v in fields if n.lower() == "content-length"), "0")
    dropped = ("host", "connection", "proxy-", "keep-alive", "upgrade")
    kept = [f"{n}: {v}" for n, v in fields if not n.lower().startswith(dropped)]
    authority = host if port == 80 else f"{host}:{port}"
    path = url._replace(scheme="", netloc="").geturl() or "/"
    version = event.http_version.decode("ascii")
    lines = [f"{method} {path} HTTP/{version}", f"Host: {authority}", *kept, "Connection: close"]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return Request(method, host, port, head, int(length), rest)


def _refuse_ambiguous(header: bytes) -> None:
    """Heads that two parsers could read differently: refused, never normalised."""
    if header.count(b"\n") != header.count(b"\r\n") or header.count(b"\r") != header.count(b"\r\n"):
        raise Refusal(400, "a bare CR or LF in the request head")
    lines = header.split(b"\r\n")
    if any(line[:1] in (b" ", b"\t") for line in lines[1:]):
        raise Refusal(400, "obsolete line folding in the request head")
    names = [line.split(b":", 1)[0].strip().lower() for line in lines[1:]]
    lengths = [
        line.split(b":", 1)[1]
        for line in lines[1:]
        if line.split(b":", 1)[0].lower() == b"content-length"
    ]
    if names.count(b"content-length") > 1 or any(b"," in value for value in lengths):
        raise Refusal(400, "more than one Content-Length")
    if b"transfer-encoding" in names:
        if b"content-length" in names:
            raise Refusal(400, "Transfer-Encoding together with Content-Length")
        raise Refusal(411, "chunked request bodies are not forwarded; send Content-Length")


def _h11_request(header: bytes) -> h11.Request:
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
    connection.receive_data(header + b"\r\n\r\n")
    try:
        event = connection.next_event()
    except h11.RemoteProtocolError as exc:
        raise Refusal(400, f"malformed request: {exc}") from None
    if not isinstance(event, h11.Request):
        raise Refusal(400, "incomplete request head")
    return event


def _connect(addresses: tuple[str, ...], port: int) -> socket.socket:
    last: OSError = OSError("no address")
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout=30)
        except OSError as exc:
            last = exc
    raise last


def _forward_body(client: socket.socket, upstream: socket.socket, request: Request) -> None:
    """Exactly the declared body, then nothing more from the client (no second request)."""
    left = request.body_bytes
    first = request.rest[:left]
    upstream.sendall(request.head + first)
    left -= len(first)
    while left > 0:
        chunk = client.recv(min(65536, left))
        if not chunk:
            return
        upstream.sendall(chunk)
        left -= len(chunk)


def _copy(source: socket.socket, target: socket.socket) -> None:
    while data := source.recv(65536):
        target.sendall(data)


class _Handler(socketserver.BaseRequestHandler):
    server: EgressProxy

    def handle(self) -> None:
        client: socket.socket = self.request
        if not self.server.slots.acquire(blocking=False):
            self._refuse(client, 503, f"more than {MAX_CONNECTIONS} connections at once")
            return
        try:
            self._serve(client)
        except Refusal as exc:
            self._refuse(client, exc.status, exc.reason)
        except OSError:
            pass  # a connection that broke: nothing to answer
        finally:
            self.server.slots.release()

    def _serve(self, client: socket.socket) -> None:
        request = parse(*_read_head(client))
        decision = decide(self.server.policy, request.host, request.port)
        self.server.decisions.write(request.method, request.host, request.port, decision)
        if not decision.allowed:
            raise Refusal(403, decision.reason)
        try:
            upstream = _connect(decision.addresses, request.port)
        except OSError as exc:
            raise Refusal(502, f"{request.host}:{request.port} unreachable: {exc}") from None
        with upstream:
            upstream.settimeout(IDLE_S)
            client.settimeout(IDLE_S)
            if request.method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                if request.rest:
                    upstream.sendall(request.rest)
                _relay(client, upstream)  # TLS, tunnelled as it is
            else:
                _forward_body(client, upstream, request)
                _copy(upstream, client)

    def _refuse(self, client: socket.socket, status: int, reason: str) -> None:
        body = f"aiworker egress: {reason}\n".encode()
        with contextlib.suppress(OSError):
            client.sendall(
                f"HTTP/1.1 {status} Refused\r\nContent-Type: text/plain\r\nContent-Length: "
                f"{len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )


class EgressProxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, policy: EgressPolicy, decisions: DecisionLog) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.policy = policy
        self.decisions = decisions
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True, name="egress")
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def close(self) -> None:
        self.shutdown()
        self.server_close()
