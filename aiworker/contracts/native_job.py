"""The runner's side of its contracts, importable without pydantic: the names, the job
request (checked against its JSON Schema, the contract's one definition) and the shapes
of what a runner builds. The controller checks what it receives with the pydantic models
in contracts/runner.py."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Final, Literal, TypedDict

from aiworker.contracts import jsonshape

REQUEST_CONTRACT: Final = "ait.runner.native-job.v3"
RESULT_CONTRACT: Final = "ait.runner.native-result.v1"
ERROR_CONTRACT: Final = "ait.runner.error.v1"
DELIVERY_CONTRACT: Final = "ait.runner.delivery.v1"
ENTRYPOINT_SELECTOR = "./ci/run"
MAX_REQUEST_BYTES = 1024 * 1024
REQUEST_SCHEMA_FILE = Path(__file__).with_name("native-job.v3.schema.json")


class LocalDirectorySource(TypedDict):
    kind: Literal["local_directory"]
    path: str


class RemoteSnapshotSource(TypedDict):
    kind: Literal["remote_snapshot"]
    repository_index: int
    repository_name: str
    snapshot_id: str
    external: dict[str, str]


class Command(TypedDict):
    argv: list[str]
    working_directory: str
    environment: dict[str, str]
    # Names of environment variables whose values are masked in the kept tails.
    secret_environment: list[str]


class JobRequest(TypedDict):
    contract: str
    label: str
    source: LocalDirectorySource | RemoteSnapshotSource
    command: Command
    timeout_ms: int
    suite_id: str


class Materialization(TypedDict):
    """What filling a workspace made: the result's `materialization`."""

    files: int
    directories: int
    symlinks: int
    skipped_special: int
    bytes: int
    duration_ms: int


class ArtifactRef(TypedDict):
    """A payload the runner sent to the controller's artifact store before delivering
    (a stream's log); the result names it."""

    name: str
    sha256: str
    size: int
    media_type: str


@cache
def request_schema() -> dict[str, Any]:
    return jsonshape.load(REQUEST_SCHEMA_FILE)


def check_request(document: Any) -> JobRequest:
    """DOCUMENT as a job request with its defaults; jsonshape.ShapeError otherwise."""
    request: JobRequest = jsonshape.validate(request_schema(), document)
    return request


def error_document(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """An ait.runner.error.v1 document."""
    return {"contract": ERROR_CONTRACT, "code": code, "message": message, "field": field}
