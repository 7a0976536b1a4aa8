"""Checks every request the adapter sends and every answer it gets against Forgejo's OpenAPI.

The official document is vendored in tests/fixtures/forgejo/. Response schemas are made
strict here (no properties beyond the document's), so the sandbox cannot grow
fields Forgejo does not have; like Go's encoder, a list or object may be null.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import jsonschema

SWAGGER = Path(__file__).resolve().parent / "fixtures" / "forgejo" / "forgejo-swagger.v1.json"


class Violation(AssertionError):
    pass


# Go pointer fields the document types as plain strings (Forgejo's structs package).
POINTER_STRINGS = {
    ("PullRequest", "merge_commit_sha"),
    *(
        ("ContentsResponse", name)
        for name in (
            "encoding",
            "content",
            "target",
            "url",
            "html_url",
            "git_url",
            "download_url",
            "submodule_git_url",
        )
    ),
}


def _nullable(schema: dict, pointer: bool) -> dict:
    go_pointer = schema.get("format") == "date-time" or pointer
    if "$ref" in schema or schema.get("type") in ("object", "array") or go_pointer:
        return {"anyOf": [schema, {"type": "null"}]}
    return schema


def _strict(name: str, definition: dict) -> dict:
    out = copy.deepcopy(definition)
    if out.get("type") == "object" and "properties" in out:
        out["additionalProperties"] = False
        out["properties"] = {
            key: _nullable(value, (name, key) in POINTER_STRINGS)
            for key, value in out["properties"].items()
        }
    return out


@functools.cache
def document() -> dict:
    return json.loads(SWAGGER.read_text())


@functools.cache
def definitions() -> dict:
    return {name: _strict(name, d) for name, d in document()["definitions"].items()}


@functools.cache
def operations() -> list[tuple[re.Pattern, str]]:
    """Templates as regexes: strict segments first; then parameters that may hold slashes
    (refs, branch names), as Forgejo's router allows."""
    strict, loose = [], []
    for template in document()["paths"]:
        escaped = re.escape(template).replace(r"\{", "{").replace(r"\}", "}")
        strict.append((re.compile("^" + re.sub(r"\{[^}]+\}", "([^/]+)", escaped) + "$"), template))
        loose.append((re.compile("^" + re.sub(r"\{[^}]+\}", "(.+)", escaped) + "$"), template))
    literal = lambda row: -len(re.sub(r"\{[^}]+\}", "", row[1]))  # noqa: E731
    return sorted(strict, key=lambda row: row[1].count("{")) + sorted(loose, key=literal)


def find_operation(method: str, path: str) -> tuple[str, dict]:
    for regex, template in operations():
        if regex.match(path):
            operation = document()["paths"][template].get(method.lower())
            if operation is not None:
                return template, operation
    raise Violation(f"{method} {path}: no such operation in the Forgejo API")


def validate(instance: object, schema: dict, where: str) -> None:
    root = {**schema, "definitions": definitions()}
    validator = jsonschema.Draft4Validator(root)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        raise Violation(f"{where}: {first.message[:300]} at {list(first.path)}")


# Forgejo's permission middleware answers these on every route, documented or not.
MIDDLEWARE = {401: "unauthorized", 403: "forbidden"}


def response_schema(operation: dict, status: int) -> dict | None:
    spec = operation["responses"].get(str(status)) or operation["responses"].get("default")
    if spec is None and status in MIDDLEWARE:
        spec = {"$ref": f"#/responses/{MIDDLEWARE[status]}"}
    if spec is None:
        raise Violation(f"status {status} is not a documented response")
    if "$ref" in spec:
        spec = document()["responses"][spec["$ref"].rsplit("/", 1)[1]]
    return spec.get("schema")


def check(method: str, url: str, body: bytes | None, status: int, content: bytes) -> None:
    """Validate one exchange: the request against its operation, the JSON answer against
    the documented response."""
    parts = urlsplit(url)
    if not parts.path.startswith("/api/v1/"):
        return
    path = parts.path[len("/api/v1") :]
    template, operation = find_operation(method, path)
    where = f"{method} {template}"
    params = operation.get("parameters", [])
    declared = {p["name"] for p in params if p.get("in") == "query"}
    unknown = set(parse_qs(parts.query, keep_blank_values=True)) - declared
    if unknown:
        raise Violation(f"{where}: undeclared query parameters {sorted(unknown)}")
    body_param = next((p for p in params if p.get("in") == "body"), None)
    if body:
        if body_param is None:
            raise Violation(f"{where}: sends a body the operation does not take")
        validate(json.loads(body), body_param["schema"], f"{where} request body")
    if status >= 500:
        return
    schema = response_schema(operation, status)
    if schema is not None and content and schema.get("type") != "string":
        validate(json.loads(content), schema, f"{where} -> {status}")


def check_exchange(response, *args, **kwargs):
    """A requests response hook."""
    request = response.request
    body = request.body.encode() if isinstance(request.body, str) else request.body
    check(request.method, request.url, body, response.status_code, response.content)
    return response


def check_httpx(response) -> None:
    """An httpx response hook (the generated client speaks httpx)."""
    response.read()
    request = response.request
    check(request.method, str(request.url), request.content, response.status_code, response.content)
