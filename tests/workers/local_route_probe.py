"""One local try's route, alone in a network namespace with only loopback (run under
`unshare --net`): llama-server, the gate, and OpenCode as the llama adapter starts it,
traced for every socket connect. Prints what the gate counted and every IPv4/IPv6
address OpenCode's processes tried to reach, as JSON.

    python -m tests.workers.local_route_probe SERVER MODEL WORKDIR NPM_BIN
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

from aiworker.adapters.providers.base import RunRequest
from aiworker.adapters.providers.llama import LlamaProvider
from aiworker.config.models import LocalBounds as Bounds
from aiworker.runtime.model_gate import ModelGate
from tests.llama_fixtures import MODEL_ALIAS, start_server

# IPv4: sin_port=htons(P), sin_addr=inet_addr("A"); IPv6: sin6_port=htons(P),
# sin6_flowinfo=..., inet_pton(AF_INET6, "A", ...).
CONNECT = re.compile(
    r"connect\(\d+, \{sa_family=AF_INET6?, sin6?_port=htons\((\d+)\), "
    r"(?:sin6_flowinfo=[^,]+, )?(?:sin_addr=inet_addr\(|inet_pton\(AF_INET6, )\"([^\"]+)\""
)


def main() -> None:
    server_bin, model, workdir = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    server = start_server((server_bin, model), workdir)
    repo = workdir / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a * b\n")
    bounds = Bounds(tokens_per_request=32, tokens_per_try=64, requests_per_try=4)
    cancel = threading.Event()
    try:
        with ModelGate(server.url, bounds, cancel) as gate:
            provider = LlamaProvider(server.url, 200, bounds).through(gate.url)
            spec = provider.command(
                RunRequest(
                    "implementation",
                    MODEL_ALIAS,
                    None,
                    repo,
                    workdir / "schema.json",
                    "Fix add() in calc.py.",
                )
            )
            trace = workdir / "connects.txt"
            argv = ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace), *spec.argv]
            env = {**spec.env, "PATH": f"{sys.argv[4]}:{spec.env['PATH']}"}
            done = subprocess.run(
                argv, env=env, input=spec.stdin, capture_output=True, timeout=300, check=False
            )
        use = gate.use.as_dict()
    finally:
        server.process.kill()
    reached = sorted({f"{host}:{port}" for port, host in CONNECT.findall(trace.read_text())})
    print(
        json.dumps(
            {
                "use": use,
                "reached": reached,
                "gate": gate.target,
                "exit": done.returncode,
                "stderr": done.stderr.decode()[-2000:],
            }
        )
    )


if __name__ == "__main__":
    main()
