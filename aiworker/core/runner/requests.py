"""Validating a runner job request before anything runs.

Every rejection carries a stable code and the field it is about; nothing is
copied or executed for a rejected request.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from aiworker.contracts.jsonshape import ShapeError
from aiworker.contracts.native_job import (
    MAX_REQUEST_BYTES,
    REQUEST_CONTRACT,
    JobRequest,
    check_request,
)
from aiworker.errors import InvalidInput

RESERVED_PREFIX = "AIWORKER_"
ENTRYPOINT_CANDIDATES = ("ci/run.sh", "ci/run")


class RequestRejected(InvalidInput):
    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message, code=code)
        self.field = field


def parse_request(raw: bytes) -> JobRequest:
    if len(raw) > MAX_REQUEST_BYTES:
        raise RequestRejected(
            "request_too_large", f"request is larger than {MAX_REQUEST_BYTES} bytes"
        )
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestRejected("invalid_json", f"request is not valid JSON: {exc}") from None
    except RecursionError:  # a few KiB of [[[[...: deeper than any request is
        raise RequestRejected("invalid_json", "request is nested too deeply") from None
    if not isinstance(document, dict):
        raise RequestRejected("invalid_request", "request must be a JSON object")
    if "contract" not in document:
        raise RequestRejected("missing_field", "contract: field required", "contract")
    if document["contract"] != REQUEST_CONTRACT:
        raise RequestRejected(
            "unsupported_contract",
            f"contract must be {REQUEST_CONTRACT!r}, not {str(document['contract'])[:80]!r}",
            "contract",
        )
    try:
        request = check_request(document)
    except ShapeError as exc:
        raise RequestRejected(exc.code, exc.message, exc.field) from None
    _check_environment(request)
    _check_working_directory_text(request["command"]["working_directory"])
    return request


def _check_environment(request: JobRequest) -> None:
    environment = request["command"]["environment"]
    for name in environment:
        field = f"command.environment.{name}"
        if not name or "=" in name or "\0" in name:
            raise RequestRejected(
                "environment_name_invalid",
                f"environment name {name!r} is empty or contains '=' or NUL",
                field,
            )
        if name.upper().startswith(RESERVED_PREFIX):
            raise RequestRejected(
                "environment_reserved",
                f"environment name {name!r} is owned by the runner ({RESERVED_PREFIX}*)",
                field,
            )
    for value in environment.values():
        if "\0" in value:
            raise RequestRejected(
                "environment_value_invalid", "environment values must not contain NUL"
            )
    for name in request["command"]["secret_environment"]:
        if name not in environment:
            raise RequestRejected(
                "secret_not_in_environment",
                f"secret_environment names {name!r}, which command.environment does not set",
                "command.secret_environment",
            )


def _check_working_directory_text(text: str) -> None:
    path = PurePosixPath(text)
    if path.is_absolute() or ".." in path.parts or "\0" in text:
        raise RequestRejected(
            "working_directory_invalid",
            f"working_directory {text!r} must be relative and stay inside the workspace",
            "command.working_directory",
        )


def source_of(request: JobRequest, kind: str, code: str, why: str) -> Any:
    """The request's source, which must be of KIND; else it is rejected as CODE, saying WHY."""
    source = request["source"]
    if source["kind"] != kind:
        raise RequestRejected(code, why, "source.kind")
    return source


def resolve_source(request: JobRequest, source_root: Path) -> Path:
    """The local source directory, which must lie inside SOURCE_ROOT."""
    why = "remote_snapshot sources are fetched by `runner run-job`, not `runner execute`"
    source = source_of(request, "local_directory", "source_unavailable", why)
    root = source_root.resolve()
    candidate = Path(source["path"])
    resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if resolved != root and root not in resolved.parents:
        raise RequestRejected(
            "source_outside_root",
            f"source path {source['path']!r} is outside {root}",
            "source.path",
        )
    if not resolved.is_dir():
        raise RequestRejected(
            "source_missing", f"source path {source['path']!r} is not a directory", "source.path"
        )
    return resolved


def resolve_entrypoint(source: Path, working_directory: str) -> tuple[Path, str]:
    """Check the working directory and entrypoint in SOURCE; return (workdir, relative entry)."""
    workdir = source
    for part in PurePosixPath(working_directory).parts:
        if part == ".":
            continue
        workdir = workdir / part
        info = _lstat(workdir)
        if info is None or not stat.S_ISDIR(info.st_mode):
            kind = "a symbolic link" if info and stat.S_ISLNK(info.st_mode) else "not a directory"
            raise RequestRejected(
                "working_directory_invalid",
                f"working_directory {working_directory!r}: {part!r} is {kind}",
                "command.working_directory",
            )
    for relative in ENTRYPOINT_CANDIDATES:
        parent_info = _lstat(workdir / "ci")
        if parent_info is not None and stat.S_ISLNK(parent_info.st_mode):
            raise RequestRejected(
                "entrypoint_symlink", "the ci directory is a symbolic link", "command.argv"
            )
        info = _lstat(workdir / relative)
        if info is None:
            continue
        if stat.S_ISLNK(info.st_mode):
            raise RequestRejected(
                "entrypoint_symlink", f"{relative} is a symbolic link", "command.argv"
            )
        if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o111:
            raise RequestRejected(
                "entrypoint_not_executable",
                f"{relative} is not an executable file",
                "command.argv",
            )
        return workdir, relative
    raise RequestRejected(
        "entrypoint_missing",
        f"no {' or '.join(ENTRYPOINT_CANDIDATES)} in {working_directory!r}",
        "command.argv",
    )


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None
