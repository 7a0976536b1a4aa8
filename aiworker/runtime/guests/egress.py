"""The guests' only way out: an HTTP proxy on the host (CONNECT and plain HTTP) that
admits allowlisted names on ports 80 and 443, resolves them itself and refuses any that
resolve to an address that is not global (private, loopback, link-local, metadata,
shared, reserved), tunnels TLS without looking into it, and logs every decision.

An operator may trust networks explicitly (`trusted`: an internal mirror); nothing
else that is not global is ever reached, whatever name points at it.
"""

from __future__ import annotations

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

log = logging.getLogger("aiworker.egress")
PORTS = (80, 443)
HEAD_LIMIT = 16 * 1024
IDLE_S = 300.0
METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
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
        if any(address in ipaddress.ip_network(net, strict=False) for net in self.trusted):
            return address not in METADATA
        return address.is_global and address not in METADATA


@dataclass
class Decision:
    allowed: bool
    reason: str
    address: str | None = None


def decide(policy: EgressPolicy, host: str, port: int) -> Decision:
    """Whether HOST:PORT may be reached, and at which address (resolved here, once)."""
    if port not in policy.ports:
        return Decision(False, f"port {port} is not allowed (only {policy.ports})")
    if not policy.allows_name(host):
        return Decision(False, f"{host} is not on the allowlist")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return Decision(False, f"{host} does not resolve: {exc}")
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    refused = [str(a) for a in addresses if not policy.allows_address(a)]
    if refused or not addresses:
        return Decision(False, f"{host} resolves to a non-public address ({refused[0]})")
    return Decision(True, "allowlisted", str(addresses[0]))


@dataclass
class DecisionLog:
    path: Path | None
    phase: str
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, method: str, host: str, port: int, decision: Decision) -> None:
        entry = {
            "at": time.time(),
            "phase": self.phase,
            "method": method,
            "host": host,
            "port": port,
            "allowed": decision.allowed,
            "reason": decision.reason,
            "address": decision.address,
        }
        log.info(
            "egress %s %s:%d %s: %s",
            method,
            host,
            port,
            "allowed" if decision.allowed else "refused",
            decision.reason,
        )
        if self.path is not None:
            with self.lock, self.path.open("a") as handle:
                handle.write(json.dumps(entry) + "\n")


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


class _Handler(socketserver.BaseRequestHandler):
    server: EgressProxy

    def handle(self) -> None:
        client: socket.socket = self.request
        client.settimeout(30)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk or len(head) > HEAD_LIMIT:
                return
            head += chunk
        header, _, rest = head.partition(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ")
        except ValueError:
            client.sendall(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
            return
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            host = host.strip("[]")
        else:
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                self._refuse(client, 400, "only absolute http:// URLs and CONNECT")
                return
            host, port_text = url.hostname, str(url.port or 80)
        port = int(port_text) if port_text.isdigit() else -1
        decision = decide(self.server.policy, host, port)
        self.server.decisions.write(method, host, port, decision)
        if not decision.allowed or decision.address is None:
            self._refuse(client, 403, decision.reason)
            return
        try:
            upstream = socket.create_connection((decision.address, port), timeout=30)
        except OSError as exc:
            self._refuse(client, 502, f"{host}:{port} unreachable: {exc}")
            return
        with upstream:
            upstream.settimeout(None)
            client.settimeout(None)
            if method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                if rest:
                    upstream.sendall(rest)
            else:
                path = urlsplit(target)._replace(scheme="", netloc="").geturl() or "/"
                kept = [h for h in lines[1:] if not h.lower().startswith(("proxy-", "connection:"))]
                request = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close"])
                upstream.sendall(request.encode("latin-1") + b"\r\n\r\n" + rest)
            _relay(client, upstream)

    def _refuse(self, client: socket.socket, status: int, reason: str) -> None:
        body = f"aiworker egress: {reason}\n".encode()
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
        self.thread = threading.Thread(target=self.serve_forever, daemon=True, name="egress")
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def close(self) -> None:
        self.shutdown()
        self.server_close()
