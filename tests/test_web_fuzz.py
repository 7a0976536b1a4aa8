"""A fuzz run of the served OpenAPI document (schemathesis) against a running server: no
request ends in a server error, and every response keeps to the document (status codes,
content types, bodies). `start-now` is left out: it starts a scheduler tick each time."""

from __future__ import annotations

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.test_web_api import web  # noqa: F401 - the running server fixture

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.mark.slow
def test_the_api_keeps_to_its_document(web):  # noqa: F811
    url, _ = web
    schema = schemathesis.openapi.from_url(f"{url}/api/v1/openapi.json")
    session = requests.Session()
    token = session.get(f"{url}/api/v1/session", timeout=10).json()["csrf_token"]
    fuzzed = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path == "/api/v1/actions/start-now":
            continue

        @given(case=operation.as_strategy())
        @settings(
            max_examples=30,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def fuzz(case):
            case.call_and_validate(
                base_url=url, session=session, headers={"X-CSRF-Token": token}, checks=CHECKS
            )

        fuzz()
        fuzzed.append(f"{operation.method.upper()} {operation.path}")
    assert len(fuzzed) >= 12, fuzzed


@pytest.mark.slow
def test_the_runner_api_never_fails_on_what_a_runner_sends(upgraded, tmp_path, monkeypatch):
    """Fuzzed bodies, paths and indexes against the runner listener, with a valid token
    and jobs queued: each is answered (2xx, or 4xx with the error shape), never with a
    server error."""
    from aiworker.store.engine import Database
    from aiworker.store.worker_jobs import enqueue
    from tests.fleet_fixtures import TOKEN, runner_listener, write_config

    monkeypatch.setenv("AIWORKER_CONFIG", str(write_config(tmp_path)))
    db = Database(f"sqlite:///{upgraded}")
    for n in range(20):
        enqueue(db, 1 + n % 2, {"label": f"job {n}", "suite_id": "ci"})
    db.dispose()
    with runner_listener() as listener:
        schema = schemathesis.openapi.from_url(f"{listener.url}/api/runner/v1/openapi.json")
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {TOKEN}"
        fuzzed = []
        for result in schema.get_all_operations():
            operation = result.ok()

            @given(case=operation.as_strategy())
            @settings(
                max_examples=25,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.generate],  # a failure is reported as found, not shrunk
            )
            def fuzz(case):
                wait = case.body.get("wait_ms") if isinstance(case.body, dict) else None
                if isinstance(wait, int | float) and not isinstance(wait, bool):
                    # Long-polls wait (29999.0 is a valid int to the API, and waits too).
                    case.body["wait_ms"] = min(wait, 200)
                response = case.call(base_url=listener.url, session=session, timeout=20)
                assert response.status_code < 500, (case.path, case.body, response.text)
                if response.status_code >= 400:
                    assert set(response.json()["error"]) >= {"code", "message"}

            fuzz()
            fuzzed.append(f"{operation.method.upper()} {operation.path}")
    assert len(fuzzed) >= 7, fuzzed
