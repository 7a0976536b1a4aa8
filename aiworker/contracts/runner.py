"""The runner's JSON contracts: job request, result and error."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, StrictInt, StringConstraints, field_validator

from aiworker.contracts.base import Contract

REQUEST_CONTRACT: Final = "ait.runner.native-job.v3"
RESULT_CONTRACT: Final = "ait.runner.native-result.v1"
ERROR_CONTRACT: Final = "ait.runner.error.v1"
DELIVERY_CONTRACT: Final = "ait.runner.delivery.v1"
ENTRYPOINT_SELECTOR = "./ci/run"
MAX_REQUEST_BYTES = 1024 * 1024


def _no_nul(value: str) -> str:
    # A NUL byte cannot reach an argv, a path or an environment; refuse it here, by name.
    if "\x00" in value:
        raise ValueError("must not contain a NUL byte")
    return value


NoNul = AfterValidator(_no_nul)
Label = Annotated[str, StringConstraints(min_length=1, max_length=200), NoNul]
ShortText = Annotated[str, StringConstraints(max_length=4096), NoNul]
PathText = Annotated[str, StringConstraints(min_length=1, max_length=4096), NoNul]


class LocalDirectorySource(Contract):
    kind: Literal["local_directory"]
    path: PathText


class RemoteSnapshotSource(Contract):
    kind: Literal["remote_snapshot"]
    repository_index: Annotated[StrictInt, Field(ge=1)]
    repository_name: Label
    snapshot_id: Label
    external: dict[str, ShortText] = {}


Source = Annotated[LocalDirectorySource | RemoteSnapshotSource, Field(discriminator="kind")]


class Command(Contract):
    argv: Annotated[list[ShortText], Field(min_length=1, max_length=256)]
    working_directory: PathText = "."
    # Names and values are checked by the runner itself (runner/requests.py), with codes.
    environment: Annotated[
        dict[str, Annotated[str, StringConstraints(max_length=4096)]], Field(max_length=256)
    ] = {}
    # Names of environment variables whose values are masked in the kept tails.
    secret_environment: Annotated[list[str], Field(max_length=256)] = []

    @field_validator("argv")
    @classmethod
    def _selector(cls, argv: list[str]) -> list[str]:
        if argv[0] != ENTRYPOINT_SELECTOR:
            raise ValueError(f"argv[0] must be the logical selector {ENTRYPOINT_SELECTOR!r}")
        return argv


class JobRequest(Contract):
    contract: Literal["ait.runner.native-job.v3"]
    label: Label
    source: Source
    command: Command
    # Integers, strictly, as the published schema says: no "5000", no true.
    timeout_ms: Annotated[StrictInt, Field(ge=1, le=7 * 24 * 3600 * 1000)]
    suite_id: Label


Status = Literal["succeeded", "command_failed", "timed_out"]


class StreamEvidence(Contract):
    total_bytes: int
    sha256: str
    tail_base64: str
    tail_bytes: int
    truncated: bool
    masked: bool


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


def _schemas() -> dict[str, type[Contract]]:
    from aiworker.contracts.agent import AgentResult
    from aiworker.contracts.continuation import Continuation
    from aiworker.contracts.snapshot import SnapshotManifest

    return {
        "request": JobRequest,
        "result": JobResult,
        "error": RunnerError,
        "delivery": Delivery,
        "snapshot": SnapshotManifest,
        "agent-result": AgentResult,
        "continuation": Continuation,
    }


SCHEMAS: dict[str, type[Contract]] = _schemas()
