"""A command in a guest, as a local process: `python -m aiworker.guest_exec SPEC` logs
in (pinned host key), runs SPEC's command, copies its stdin in and its stdout and stderr
out as they come, and exits with the command's exit status (255 when the guest could not
be reached). The runner core runs this like any job, so timeouts, cancellation and
bounded output work the same through SSH; killing it ends the session."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from aiworker.runtime.guests.ssh import GuestShell, GuestUnreachable, HostKeyRefused, pump, request


def _feed(channel: object, stream: int) -> None:
    try:
        while data := os.read(stream, 65536):
            channel.sendall(data)  # type: ignore[attr-defined]
    except OSError:
        pass
    finally:
        channel.shutdown_write()  # type: ignore[attr-defined]


def main(spec_path: str) -> int:
    import paramiko

    spec = json.loads(Path(spec_path).read_text())
    try:
        shell = GuestShell.connect(
            int(spec["port"]), spec["host_key"], Path(spec["client_key"]), time.monotonic() + 30
        )
        transport = shell.client.get_transport()
        assert transport is not None
        channel = transport.open_session(timeout=10)
        request(channel, "exec_command", spec["command"])
    except (GuestUnreachable, HostKeyRefused) as exc:
        sys.stderr.write(f"aiworker: {exc.message}\n")
        return 255
    except (paramiko.SSHException, OSError, EOFError) as exc:
        sys.stderr.write(f"aiworker: no session in the guest: {exc or type(exc).__name__}\n")
        return 255
    threading.Thread(target=_feed, args=(channel, 0), daemon=True).start()
    out, err = sys.stdout.buffer, sys.stderr.buffer
    status = pump(channel, _writer(out), _writer(err), None)
    assert status is not None  # no deadline: the runner's own ends this process
    return status


def _writer(stream: BinaryIO) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        stream.write(data)
        stream.flush()

    return write


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
