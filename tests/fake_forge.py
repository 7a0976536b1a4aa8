"""A fake forge on loopback that answers as a script says: for the adapter's faults and
for what git and the adapter do with a hostile forge's answers."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

USER = {"id": 1, "login": "bot", "full_name": "", "email": "", "is_admin": False}


class Script:
    """What the fake server answers, one action per request, then 200 with USER."""

    def __init__(self, *actions):
        self.actions = list(actions)
        self.seen = []


def start(script):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            return None

        def do_GET(self):
            script.seen.append((time.monotonic(), self.path, self.headers.get("Authorization")))
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            action = script.actions.pop(0) if script.actions else ("json", 200, USER, {})
            if action[0] == "drop":
                self.connection.shutdown(socket.SHUT_RDWR)
                self.connection.close()
                return
            # ("json", STATUS, BODY, HEADERS); ("raw", ...) sends BODY's bytes as they are;
            # ("trickle", ...) sends them a byte every 0.2 s, a forge that never stalls.
            kind, status, body, headers = action
            data = body if kind in ("raw", "trickle") else json.dumps(body).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if kind == "json":
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if kind != "trickle":
                self.wfile.write(data)
                return
            for byte in data:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)

        do_POST = do_PATCH = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def fake():
    servers = []

    def make(*actions):
        script = Script(*actions)
        server, url = start(script)
        servers.append(server)
        return script, url

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()
