"""A fuzz run of the served OpenAPI document (schemathesis) against a running server: no
request ends in a server error, and every response keeps to the document (status codes,
content types, bodies). `start-now` is left out: it starts a scheduler tick each time."""

from __future__ import annotations

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
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
