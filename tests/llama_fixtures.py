"""A real llama-server with the small GGUF model (`make llama` builds both into a cache
outside the tree) and OpenCode from npm (`make llama` installs it under .cache/npm)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

REPO_ROOT = Path(__file__).resolve().parent.parent
NPM_BIN = REPO_ROOT / ".cache" / "npm" / "node_modules" / ".bin"
MODEL_ALIAS = "gemma3-270m"


@dataclass
class LlamaServer:
    url: str
    log: Path
    process: subprocess.Popen

    def metrics(self) -> dict[str, float]:
        text = requests.get(f"{self.url}/metrics", timeout=10).text
        found = {}
        for line in text.splitlines():
            if line.startswith("llamacpp:"):
                name, value = line.split()
                found[name.removeprefix("llamacpp:")] = float(value)
        return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def llama_files() -> tuple[Path, Path]:
    """llama-server and the GGUF model, built by `make llama` (built here if it was not)."""
    done = subprocess.run(
        [str(REPO_ROOT / "contrib" / "llama" / "build-llama"), sys.executable],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    server, model = done.stdout.split()
    return Path(server), Path(model)


def start_server(files: tuple[Path, Path], folder: Path, *args: str) -> LlamaServer:
    server, model = files
    port = free_port()
    log = folder / f"llama-server-{port}.log"
    argv = [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["-c", "16384", "-np", "1", "-t", "2", "--no-webui", "--metrics"]
    argv += ["--alias", MODEL_ALIAS, *args]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return LlamaServer(url, log, process)
        except requests.RequestException:
            pass
        time.sleep(0.2)
    process.kill()
    raise AssertionError(f"llama-server did not come up: {log.read_text()[-3000:]}")


@pytest.fixture
def llama_server(llama_files, tmp_path):
    """A fresh server per test: its counters are the test's alone."""
    server = start_server(llama_files, tmp_path)
    yield server
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture
def opencode_on_path(monkeypatch) -> Path:
    """OpenCode from npm first on PATH (for aiworker's processes and their jails)."""
    binary = NPM_BIN / "opencode"
    assert binary.exists(), "OpenCode is missing: run `make llama`"
    monkeypatch.setenv("PATH", f"{NPM_BIN}{os.pathsep}{os.environ['PATH']}")
    return binary
