"""The runner's JSON contracts as the controller checks them: result, error, delivery.
The job request is defined by its JSON Schema (contracts/native_job.py), which a runner
host checks without pydantic."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, StringConstraints, model_validator

from aiworker.contracts.base import Contract
from aiworker.contracts.native_job import (
    DELIVERY_CONTRACT,
    ENTRYPOINT_SELECTOR,
    ERROR_CONTRACT,
    MAX_REQUEST_BYTES,
    REQUEST_CONTRACT,
    RESULT_CONTRACT,
    request_schema,
)

__all__ = [
    "DELIVERY_CONTRACT",
    "ENTRYPOINT_SELECTOR",
    "ERROR_CONTRACT",
    "MAX_REQUEST_BYTES",
    "REQUEST_CONTRACT",
    "RESULT_CONTRACT",
]


Status = Literal["succeeded", "command_failed", "timed_out"]


# A stream's tail as a job delivers it: at most the runner's 64 KiB (base64 grows it by a
# third), and its count and digest must say what it is.
MAX_TAIL_BYTES = 64 * 1024


class StreamEvidence(Contract):
    total_bytes: Annotated[int, Field(ge=0)]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    tail_base64: Annotated[str, StringConstraints(max_length=(MAX_TAIL_BYTES + 2) // 3 * 4)]
    tail_bytes: Annotated[int, Field(ge=0, le=MAX_TAIL_BYTES)]
    truncated: bool
    masked: bool

    @model_validator(mode="after")
    def _tail_as_counted(self) -> StreamEvidence:
        try:
            tail = base64.b64decode(self.tail_base64, validate=True)
        except binascii.Error:
            raise ValueError("tail_base64 is not base64") from None
        if len(tail) != self.tail_bytes or self.tail_bytes > self.total_bytes:
            raise ValueError("tail_bytes does not match the tail or exceeds total_bytes")
        return self


class Evidence(Contract):
    stdout: StreamEvidence
    stderr: StreamEvidence


class SuiteRecord(Contract):
    suite_id: str
    status: Literal["pass", "fail"]
    duration_ms: int


class Materialization(Contract):
    files: int
    directories: int
    symlinks: int
    skipped_special: int
    bytes: int
    duration_ms: int


class Termination(Contract):
    signals_sent: list[str]
    drain_timed_out: bool
    leftover_processes_killed: int


class Cleanup(Contract):
    removed: bool
    attempt_path: str
    entries_removed: int
    duration_ms: int
    error: str | None = None


class ArtifactRef(Contract):
    """A payload the runner sent to the controller's artifact store before delivering
    (a stream's log); the controller accepts the result only when each is there whole."""

    name: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9._-]{0,63}$")]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    size: Annotated[StrictInt, Field(ge=1)]
    media_type: Annotated[str, StringConstraints(min_length=1, max_length=100)]


class JobResult(Contract):
    contract: Literal["ait.runner.native-result.v1"] = RESULT_CONTRACT
    label: str
    suite_id: str
    attempt_id: str
    status: Status
    tests_status: Literal["pass", "fail"]
    exit_code: int | None
    signal: str | None
    spawn_error: str | None = None
    started_at: str
    finished_at: str
    duration_ms: int
    suites: list[SuiteRecord]
    materialization: Materialization
    evidence: Evidence
    termination: Termination
    cleanup: Cleanup
    artifacts: Annotated[list[ArtifactRef], Field(max_length=8)] = []

    def document(self) -> dict[str, Any]:
        """The JSON document, without `artifacts` when there are none: a controller that
        predates the field reads it as before."""
        document = self.model_dump(mode="json")
        if not document["artifacts"]:
            del document["artifacts"]
        return document


class RunnerError(Contract):
    contract: Literal["ait.runner.error.v1"] = ERROR_CONTRACT
    code: str
    message: str
    field: str | None = None


class Delivery(Contract):
    """The accepted terminal transition of a worker job, as the controller recorded it:
    the runner's result (it ran) or its error (it could not run the job)."""

    contract: Literal["ait.runner.delivery.v1"] = DELIVERY_CONTRACT
    repository_index: int
    worker_job_index: int
    attempt: int
    worker_id: str
    outcome: Literal["completed", "failed"]
    result: JobResult | None = None
    error: RunnerError | None = None
    accepted_at: str


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema of the contract NAME ; KeyError for an unknown name."""
    from aiworker.contracts.agent import AgentResult
    from aiworker.contracts.continuation import Continuation
    from aiworker.contracts.snapshot import SnapshotManifest

    if name == "request":
        return request_schema()
    models: dict[str, type[Contract]] = {
        "result": JobResult,
        "error": RunnerError,
        "delivery": Delivery,
        "snapshot": SnapshotManifest,
        "agent-result": AgentResult,
        "continuation": Continuation,
    }
    return models[name].model_json_schema()
