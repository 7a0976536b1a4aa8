"""Starting and seeding the sandbox forge."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiworker.core.report import Report
from aiworker.errors import InvalidInput


def serve_forge(data: Path, host: str, port: int, announce: Callable[[str], None]) -> None:
    from aiworker.sandbox.server import make_server

    if data.exists() and not data.is_dir():  # else said as a failure to listen
        raise InvalidInput(f"--data {data}: exists and is not a directory")
    try:
        server, app = make_server(data.absolute(), host, port)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    except OSError as exc:
        raise InvalidInput(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    announce(app.root_url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@dataclass
class SeedReport(Report):
    users: list[dict[str, Any]]
    repositories: list[dict[str, Any]]


def seed_forge(data: Path) -> SeedReport:
    from aiworker.sandbox.seed import seed

    seeded = seed(data.absolute())
    return SeedReport(seeded["users"], seeded["repositories"])
