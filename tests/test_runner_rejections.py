"""Every invalid request is refused with its stable code and exit 2; nothing runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from aiworker.core.runner.execute import RunnerSettings, execute_request
from aiworker.core.runner.requests import RequestRejected, parse_request
from tests.runner_helpers import execute, make_source, request, runner_argv


@pytest.fixture
def setup(tmp_path):
    marker = tmp_path / "ran.marker"
    source = make_source(tmp_path, f"touch {marker}\n")
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    return source, marker, attempts


def with_command(source, **command):
    return request(source, command=command)


def cases(source: Path) -> list[tuple[str, object]]:
    base = request(source)
    unknown = {**base, "priority": 1}
    missing = {k: v for k, v in base.items() if k != "suite_id"}
    unknown_nested = request(source, command={"shell": "bash"})
    return [
        ("unknown_field", unknown),
        ("unknown_field", unknown_nested),
        ("missing_field", missing),
        ("unsupported_contract", {**base, "contract": "ait.runner.native-job.v2"}),
        ("missing_field", {k: v for k, v in base.items() if k != "contract"}),
        ("invalid_field", with_command(source, argv=["./ci/other"])),
        ("invalid_field", {**base, "timeout_ms": 0}),
        ("working_directory_invalid", with_command(source, working_directory="/etc")),
        ("working_directory_invalid", with_command(source, working_directory="../src")),
        ("working_directory_invalid", with_command(source, working_directory="a/../../x")),
        ("working_directory_invalid", with_command(source, working_directory="linked")),
        ("environment_name_invalid", with_command(source, environment={"": "x"})),
        ("environment_name_invalid", with_command(source, environment={"A=B": "x"})),
        ("environment_reserved", with_command(source, environment={"AIWORKER_ATTEMPT_ID": "x"})),
        ("environment_reserved", with_command(source, environment={"aiworker_suite_id": "x"})),
        ("secret_not_in_environment", with_command(source, secret_environment=["NOPE"])),
        ("source_outside_root", request("/etc")),
        ("source_outside_root", request(source / ".." / "..")),
        ("source_missing", request(source / "nope")),
    ]


def test_each_rejection_has_its_code_and_runs_nothing(setup, tmp_path):
    source, marker, attempts = setup
    (source / "linked").symlink_to(source / "ci")
    for expected, document in cases(source):
        result = execute(document, source_root=tmp_path, attempt_root=attempts)
        assert result.exit_code == 2, (expected, result)
        error = result.json()
        assert error["contract"] == "ait.runner.error.v1"
        assert error["code"] == expected, (document, error)
        assert not marker.exists()
        assert list(attempts.iterdir()) == []


def test_oversized_and_malformed_requests(setup, tmp_path):
    source, marker, attempts = setup
    big = request(source, label="x" * 100, command={"environment": {"PAD": "y" * 4000}})
    huge = json.dumps(big).encode() + b" " * (1024 * 1024)
    for expected, raw in (
        ("request_too_large", huge),
        ("invalid_json", b"{not json"),
        ("invalid_json", b"[" * 5000 + b"]" * 5000),  # 10 KB, deeper than the parser goes
        ("invalid_request", b"[1, 2]"),
    ):
        result = execute(raw, source_root=tmp_path, attempt_root=attempts)
        assert result.exit_code == 2, result
        assert result.json()["code"] == expected
    assert not marker.exists()


@pytest.mark.parametrize(
    ("expected", "arrange"),
    [
        ("entrypoint_missing", lambda s: (s / "ci" / "run.sh").unlink()),
        ("entrypoint_not_executable", lambda s: (s / "ci" / "run.sh").chmod(0o644)),
        (
            "entrypoint_symlink",
            lambda s: (
                (s / "ci" / "run.sh").rename(s / "real.sh"),
                (s / "ci" / "run.sh").symlink_to(s / "real.sh"),
            ),
        ),
        (
            "entrypoint_symlink",
            lambda s: ((s / "ci").rename(s / "ci-real"), (s / "ci").symlink_to(s / "ci-real")),
        ),
    ],
)
def test_entrypoint_problems(setup, tmp_path, expected, arrange):
    source, marker, attempts = setup
    arrange(source)
    result = execute(request(source), source_root=tmp_path, attempt_root=attempts)
    assert result.exit_code == 2, result
    assert result.json()["code"] == expected
    assert not marker.exists()


def test_source_over_the_file_limit_is_refused_and_removed(setup, tmp_path):
    source, marker, attempts = setup
    for number in range(5):
        (source / f"f{number}").write_text("x")
    parsed = parse_request(json.dumps(request(source)).encode())
    settings = RunnerSettings(source_root=tmp_path, attempt_root=attempts, max_files=3)
    with pytest.raises(RequestRejected) as caught:
        execute_request(parsed, settings)
    assert caught.value.code == "source_too_large"
    assert list(attempts.iterdir()) == []
    assert not marker.exists()
    tight = RunnerSettings(source_root=tmp_path, attempt_root=attempts, max_bytes=3)
    with pytest.raises(RequestRejected, match="bytes"):
        execute_request(parsed, tight)
    assert list(attempts.iterdir()) == []


def test_schema_command(cli):
    for name in ("request", "result", "error"):
        result = cli("runner", "schema", name)
        assert result.exit_code == 0, result
        schema = result.json()
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False
    request_schema = cli("runner", "schema", "request").json()
    assert request_schema["properties"]["contract"]["const"] == "ait.runner.native-job.v3"
    argv = request_schema["$defs"]["Command"]["properties"]["argv"]
    assert argv["prefixItems"] == [{"const": "./ci/run"}]
    assert argv["items"]["pattern"] == "^[^\x00]*$"
    assert cli("runner", "schema", "bogus").exit_code == 2


# A remote snapshot source without its snapshot_id.
REMOTE = {"kind": "remote_snapshot", "repository_index": 1, "repository_name": "r"}


@pytest.mark.parametrize(
    ("change", "code", "field", "says"),
    [
        (lambda d: d.update(timeout_ms=True), "invalid_field", "timeout_ms", "integer"),
        (lambda d: d.update(timeout_ms="5000"), "invalid_field", "timeout_ms", "integer"),
        (lambda d: d.update(timeout_ms=5000.0), "invalid_field", "timeout_ms", "integer"),
        (
            lambda d: d.update(timeout_ms=8 * 24 * 3600 * 1000),
            "invalid_field",
            "timeout_ms",
            "at most",
        ),
        (lambda d: d.update(label="a\x00b"), "invalid_field", "label", "NUL"),
        (lambda d: d.update(label=""), "invalid_field", "label", "at least 1"),
        (
            lambda d: d["command"].update(argv=["./ci/run", "a\x00"]),
            "invalid_field",
            "command.argv[1]",
            "NUL",
        ),
        (
            lambda d: d["command"].update(argv=["./ci/run.sh"]),
            "invalid_field",
            "command.argv[0]",
            "./ci/run",
        ),
        (lambda d: d["command"].update(argv=[]), "invalid_field", "command.argv", "1 to 256"),
        (
            lambda d: d["command"].update(environment={"A": 1}),
            "invalid_field",
            "command.environment.A",
            "string",
        ),
        (lambda d: d.update(command=["./ci/run"]), "invalid_field", "command", "object"),
        (
            lambda d: d["source"].update(kind="git"),
            "invalid_field",
            "source.kind",
            "local_directory",
        ),
        (lambda d: d["source"].pop("kind"), "invalid_field", "source.kind", "required"),
        (lambda d: d["source"].update(mode="copy"), "unknown_field", "source.mode", "unknown"),
        (
            lambda d: d.update(source=dict(REMOTE)),
            "missing_field",
            "source.snapshot_id",
            "required",
        ),
    ],
)
def test_a_refused_request_names_its_field_and_why(setup, tmp_path, change, code, field, says):
    """The request is checked against its published JSON Schema: JSON's true is not an
    integer, no string carries a NUL byte, and the error names the field."""
    source, marker, attempts = setup
    document = request(source)
    change(document)
    result = execute(document, source_root=tmp_path, attempt_root=attempts)
    assert result.exit_code == 2, result
    error = result.json()
    assert (error["code"], error["field"]) == (code, field), error
    assert error["message"].startswith(f"{field}: "), error
    assert says in error["message"], error
    assert not marker.exists()


def test_defaults_of_the_schema_are_filled_in(setup):
    """A request without working_directory, environment or secret_environment gets the
    schema's defaults: the workspace itself, nothing added, nothing masked."""
    source, _marker, _attempts = setup
    parsed = parse_request(json.dumps(request(source)).encode())
    assert parsed["command"] == {
        "argv": ["./ci/run"],
        "working_directory": ".",
        "environment": {},
        "secret_environment": [],
    }


def test_the_request_schema_says_no_more_than_is_checked(tmp_path):
    """A keyword the runner's checker does not implement is refused when the schema is
    loaded: the published contract cannot promise a check that is not made."""
    from aiworker.contracts import jsonshape
    from aiworker.contracts.native_job import REQUEST_SCHEMA_FILE

    schema = json.loads(REQUEST_SCHEMA_FILE.read_text())
    assert jsonshape.load(REQUEST_SCHEMA_FILE) == schema
    schema["properties"]["label"]["format"] = "hostname"
    changed = tmp_path / "schema.json"
    changed.write_text(json.dumps(schema))
    with pytest.raises(ValueError, match="format"):
        jsonshape.load(changed)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)
def test_a_full_attempt_root_is_said_in_a_document_and_leaves_no_attempt(setup, tmp_path):
    """The attempt root is a full file system (a real tmpfs, in a mount namespace of the
    command's own): the runner answers with an error document and exit 75, and leaves
    no half-made attempt for the next run to trip over."""
    source, marker, attempts = setup
    script = (
        'mount -t tmpfs -o size=64k tmpfs "$1" && head -c 65536 /dev/zero > "$1/filler"; '
        'shift; "$@"; code=$?; rm "$ROOT/filler"; ls -A "$ROOT" > "$ROOT/../left"; exit $code'
    )
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "sh",
            "-c",
            script,
            "sh",
            str(attempts),
            *runner_argv(tmp_path, attempts),
        ],
        input=json.dumps(request(source)).encode(),
        capture_output=True,
        env={**os.environ, "ROOT": str(attempts)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 75, done
    document = json.loads(done.stdout)
    assert (document["contract"], document["code"]) == ("ait.runner.error.v1", "attempt_root_full")
    assert (tmp_path / "left").read_text() == ""
    assert not marker.exists()
