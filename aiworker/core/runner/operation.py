"""The `runner execute` operation: bytes in, one result or error document out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

from aiworker.contracts.native_job import MAX_REQUEST_BYTES, error_document
from aiworker.core.runner.execute import RunnerSettings, execute_request
from aiworker.core.runner.requests import RequestRejected, parse_request, resolve_source
from aiworker.errors import EXIT_FAILED, EXIT_INVALID, EXIT_OK, EXIT_UNAVAILABLE, FULL_ERRNOS
from aiworker.runtime.attempts import default_attempt_root, ensure_private_root


def read_request_bytes(source: str, stdin: IO[bytes]) -> bytes:
    """Read at most one byte past the limit, so an oversized request is never buffered whole."""
    if source == "-":
        return stdin.read(MAX_REQUEST_BYTES + 1)
    try:
        with open(source, "rb") as handle:
            return handle.read(MAX_REQUEST_BYTES + 1)
    except OSError as exc:
        raise RequestRejected(
            "request_unreadable", f"cannot read request {source}: {exc.strerror}"
        ) from None


def check_attempt_root(attempt_root: Path, source: Path) -> Path:
    """The attempt root as an absolute path: a directory (or one to create) outside the
    source it copies (an attempt inside its own source would copy itself)."""
    root = attempt_root.absolute()
    if os.path.lexists(root) and not root.is_dir():
        raise RequestRejected(
            "attempt_root_invalid", f"attempt root {root} exists and is not a directory"
        )
    real = root.resolve()
    if real == source or source in real.parents:
        raise RequestRejected(
            "attempt_root_inside_source",
            f"attempt root {root} lies inside the source {source}; choose one outside it",
        )
    try:
        ensure_private_root(root)  # made, this user's: refused as a document if not
    except OSError as exc:
        if exc.errno in FULL_ERRNOS:
            raise
        why = exc.strerror or str(exc).removeprefix(f"attempt root {root} ")
        raise RequestRejected("attempt_root_invalid", f"attempt root {root}: {why}") from None
    return root


def run_execute(
    request_source: str,
    stdin: IO[bytes],
    *,
    source_root: Path,
    attempt_root: Path | None,
    kill_grace_ms: int,
    drain_timeout_ms: int,
    tail_bytes: int,
) -> tuple[dict[str, Any], int]:
    """Every path option is taken relative to the working directory, once, here."""
    try:
        request = parse_request(read_request_bytes(request_source, stdin))
        source_root = source_root.absolute()
        source = resolve_source(request, source_root)
        settings = RunnerSettings(
            source_root=source_root,
            attempt_root=check_attempt_root(attempt_root or default_attempt_root(), source),
            kill_grace_s=kill_grace_ms / 1000,
            drain_timeout_s=drain_timeout_ms / 1000,
            tail_bytes=tail_bytes,
        )
        result = execute_request(request, settings)
    except RequestRejected as exc:
        return error_document(exc.code, exc.message, exc.field), EXIT_INVALID
    except OSError as exc:
        if exc.errno not in FULL_ERRNOS:
            raise
        # The attempt root cannot hold an attempt: said as a document, like any refusal.
        message = f"no space left for an attempt: {exc.strerror}"
        return error_document("attempt_root_full", message), EXIT_UNAVAILABLE
    return result, EXIT_OK if result["status"] == "succeeded" else EXIT_FAILED
