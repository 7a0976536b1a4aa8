"""A seeded sandbox forge on loopback and adapter clients whose traffic is checked."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.sandbox.app import SandboxApp
from aiworker.sandbox.seed import seed
from aiworker.sandbox.server import serve_in_thread
from tests.forge_conformance import check_exchange

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@x",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@x",
    "GIT_TERMINAL_PROMPT": "0",
}


def git(*args, cwd=None, check=True):
    """Plain git, as a user at a terminal would run it."""
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=check,
        env={**os.environ, **GIT_ENV},
    )


@dataclass
class Forge:
    url: str
    app: SandboxApp
    tokens: dict[str, str]
    data: Path
    server: Any = None

    def stop(self) -> None:
        """Stop serving: the port refuses connections from now on."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def client(self, login: str, **options) -> ForgejoClient:
        client = ForgejoClient(self.url, self.tokens[login], **options)
        client.http.session.hooks["response"].append(check_exchange)
        return client

    def as_user(self, login: str, method: str, path: str, body: Any = None) -> Any:
        """`METHOD /api/v1/repos/team/appPATH` as LOGIN, as a person on the forge would
        send it (checked against the API document); the answer's JSON, if any."""
        response = requests.request(
            method,
            f"{self.url}/api/v1/repos/team/app{path}",
            json=body,
            headers={"Authorization": f"token {self.tokens[login]}"},
            timeout=10,
        )
        check_exchange(response)
        assert response.status_code < 300, response.text
        return response.json() if response.content else None

    def clone_url(self, login: str, repo: str = "team/app") -> str:
        host = self.url.split("://", 1)[1].rstrip("/")
        return f"http://{login}:{self.tokens[login]}@{host}/{repo}.git"


@pytest.fixture
def forge(tmp_path):
    data = tmp_path / "forge"
    seeded = seed(data)
    server, app = serve_in_thread(data)
    tokens = {u["login"]: u["token"] for u in seeded["users"]}
    running = Forge(app.root_url.rstrip("/"), app, tokens, data, server)
    yield running
    running.stop()
