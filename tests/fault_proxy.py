"""A reverse proxy in front of the sandbox forge that fails as nginx does: a request that
matches a rule is answered with the rule's status and an HTML page, after it was passed
on to the forge (an answer lost: the forge was slow to answer what it did) or instead
(the forge could not be reached). Everything else is passed on as it is."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

PASSED_ON = ("Authorization", "Content-Type", "Accept", "Content-Encoding", "Git-Protocol")
PASSED_BACK = ("Content-Type", "Link", "X-Total-Count")


@dataclass
class Rule:
    method: str
    path: str  # a regular expression searched in the request's path
    status: int  # what the client gets instead of the forge's answer
    times: int = 1
    forward: bool = True  # passed on to the forge first (its answer lost), or not at all


@dataclass
class FaultProxy:
    upstream: str
    rules: list[Rule] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # "METHOD PATH" of each request failed
    url: str = ""

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return None

            def do_GET(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k in PASSED_ON}
                rule = proxy.matching(self.command, self.path)
                if rule is None or rule.forward:
                    answer = requests.request(
                        self.command,
                        proxy.upstream + self.path,
                        headers=headers,
                        data=body,
                        timeout=30,
                    )
                if rule is not None:
                    proxy.lost.append(f"{self.command} {self.path}")
                    page = f"<html><body><h1>{rule.status} Bad Gateway</h1></body></html>"
                    self.reply(rule.status, {"Content-Type": "text/html"}, page.encode())
                    return
                kept = {k: v for k, v in answer.headers.items() if k in PASSED_BACK}
                self.reply(answer.status_code, kept, answer.content)

            def reply(self, status: int, headers: dict[str, str], data: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_PATCH = do_PUT = do_DELETE = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self

    def matching(self, method: str, path: str) -> Rule | None:
        for rule in self.rules:
            if rule.times > 0 and rule.method == method and re.search(rule.path, path):
                rule.times -= 1
                return rule
        return None

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
