"""A minimal QMP client: one Unix socket, line-delimited JSON, events skipped."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiworker.errors import AiworkerError


class QmpError(AiworkerError):
    code = "qmp"


class Qmp:
    def __init__(
        self, path: Path, deadline: float, alive: Callable[[], bool] = lambda: True
    ) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._open(path, deadline, alive)
        except BaseException:
            self.sock.close()
            raise
        self.sock.settimeout(max(1.0, deadline - time.monotonic()))
        self.reader = self.sock.makefile("rb")
        self._line()  # the greeting
        self.execute("qmp_capabilities")

    def _open(self, path: Path, deadline: float, alive: Callable[[], bool]) -> None:
        # A socket path may hold 107 bytes; a deep state directory is longer. The folder
        # is reached through a descriptor of it instead (/proc/self/fd/N/qmp.sock).
        folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
        try:
            while True:
                try:
                    self.sock.connect(f"/proc/self/fd/{folder}/{path.name}")
                    break
                except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError) as exc:
                    if time.monotonic() > deadline or not alive():
                        raise QmpError(f"QEMU's monitor did not open: {exc}") from exc
                    time.sleep(0.02)
        finally:
            os.close(folder)

    def _line(self) -> dict[str, Any]:
        raw = self.reader.readline()
        if not raw:
            raise QmpError("QEMU closed its monitor")
        document: dict[str, Any] = json.loads(raw)
        return document

    def execute(self, command: str, **arguments: Any) -> Any:
        message: dict[str, Any] = {"execute": command}
        if arguments:
            message["arguments"] = arguments
        self.sock.sendall(json.dumps(message).encode() + b"\n")
        while True:
            reply = self._line()
            if "event" in reply:
                continue
            if "error" in reply:
                raise QmpError(f"QMP {command}: {reply['error'].get('desc', reply['error'])}")
            return reply.get("return")

    def wait_status(self, wanted: str, deadline: float) -> None:
        while True:
            status = self.execute("query-status").get("status")
            if status == wanted:
                return
            if time.monotonic() > deadline:
                raise QmpError(f"the guest is {status}, not {wanted}")
            time.sleep(0.01)

    def ssh_port(self) -> int:
        """The host port slirp forwards to the guest's port 22 (hostfwd with port 0)."""
        text = self.execute("human-monitor-command", **{"command-line": "info usernet"})
        found = re.search(r"HOST_FORWARD\]\s+\d+\s+127\.0\.0\.1\s+(\d+)\s+\S+\s+22\b", text)
        if found is None:
            raise QmpError(f"no SSH forward in `info usernet`: {text.strip()[:200]}")
        return int(found.group(1))

    def close(self) -> None:
        self.reader.close()
        self.sock.close()
