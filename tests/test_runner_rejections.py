"""Every invalid request is refused with its stable code and exit 2; nothing runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiworker.core.runner.execute import RunnerSettings, execute_request
from aiworker.core.runner.requests import RequestRejected, parse_request
from tests.runner_helpers import execute, make_source, request


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
    assert cli("runner", "schema", "bogus").exit_code == 2
