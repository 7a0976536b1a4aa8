"""The ASGI application: the operator API, its OpenAPI document, the page and the
receipt pages, behind request protection (web/protection.py). Errors use the CLI's
error shape."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response

from aiworker.core.context import Environment
from aiworker.errors import AiworkerError, Conflict, InvalidInput, LockHeld, NotFound, Unavailable
from aiworker.web.errors import SERVER_STATE, api_app, error_response
from aiworker.web.operator_api import build_router
from aiworker.web.protection import CsrfTokens, Protection
from aiworker.web.receipt_page import add_receipt_routes

STATUS_OF = (
    (SERVER_STATE, 503),
    (NotFound, 404),
    (InvalidInput, 400),
    (Conflict, 409),
    (LockHeld, 409),
    (Unavailable, 503),
)


def create_app(
    environment: Callable[[], Environment],
    hosts: set[str],
    origins: set[str] | None = None,
    tokens: CsrfTokens | None = None,
) -> Protection:
    tokens = tokens or CsrfTokens.of_state_dir(environment().state_dir)
    app = api_app("aiworker operator API", "/api/v1/openapi.json")
    app.include_router(build_router(environment, tokens))
    add_receipt_routes(app, environment)

    @app.exception_handler(AiworkerError)
    async def failed(_request: Request, exc: AiworkerError) -> JSONResponse:
        status = next((s for kind, s in STATUS_OF if isinstance(exc, kind)), 500)
        return error_response(status, exc.code, exc.message, getattr(exc, "problems", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:20]]
        return error_response(400, "invalid_input", "the request is not valid", details)

    files = resources.files("aiworker.web")
    page = files.joinpath("page.html").read_text(encoding="utf-8")
    script = files.joinpath("page.js").read_text(encoding="utf-8")
    # Scripts only from the page's own file: no inline script, no eval.
    policy = (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index() -> HTMLResponse:
        return HTMLResponse(page, headers={"content-security-policy": policy})

    @app.get("/page.js", include_in_schema=False)
    def page_script() -> Response:
        return Response(
            script,
            media_type="text/javascript; charset=utf-8",
            headers={"content-security-policy": policy, "cache-control": "no-cache"},
        )

    @app.api_route(
        "/api/runner/{_rest:path}", methods=["GET", "POST", "PUT"], include_in_schema=False
    )
    def not_here(_rest: str) -> JSONResponse:
        # A runner pointed at this listener: it is told where its API is served.
        why = "this is the operator's listener; a runner's is `web serve --runner-listen`"
        return error_response(404, "not_found", why)

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(status_code=204)  # no icon; answered so a browser logs no error

    return Protection(app, hosts, origins=origins, tokens=tokens)
