"""What every listener's API shares: an application that serves its OpenAPI document
and no documentation pages, and the CLI's error shape as an HTTP answer,
`{"error": {"code", "message", "details"?}}`, masked, never cached."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from aiworker.errors import ControllerIdInUse, SchemaMismatch, StateUnusable, short_of
from aiworker.secrets import redact

# The server's own state, not the request: a database of another schema (mid-upgrade),
# a state directory it cannot use, another controller on its id. Answered 503, so that a
# runner or a proxy waits and tries again instead of giving up on a request that was right.
SERVER_STATE = (SchemaMismatch, StateUnusable, ControllerIdInUse)


def api_app(title: str, openapi_url: str) -> FastAPI:
    """The application; what the framework itself refuses (an unknown path, a method the
    path lacks, a body it cannot parse) answers in the error shape too."""
    from aiworker import __version__

    app = FastAPI(
        title=title, version=__version__, openapi_url=openapi_url, docs_url=None, redoc_url=None
    )

    @app.exception_handler(HTTPException)
    async def http(_request: Request, exc: HTTPException) -> JSONResponse:
        answer = error_response(exc.status_code, "http", str(exc.detail))
        answer.headers.update(exc.headers or {})  # a 405's Allow, say
        return answer

    @app.exception_handler(OSError)
    async def short(_request: Request, exc: OSError) -> JSONResponse:
        found = short_of(exc, "the server")
        if found is None:
            raise exc  # a failure no handler expects: 500, as before
        return error_response(503, found.code, found.message)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        # The caller gets the error shape, not a text page, and only the failure's kind:
        # its text (paths, SQL and its parameters) is for the server's log, which gets it
        # with the traceback. The server closes the connection, so the answer says so.
        message = f"unexpected {type(exc).__name__}; the server's log has its details"
        answer = error_response(500, "internal", message)
        answer.headers["connection"] = "close"
        return answer

    return app


def error_response(
    status: int, code: str, message: str, details: list[str] | None = None
) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": redact(message)}
    if details:
        error["details"] = [redact(d) for d in details]
    return JSONResponse({"error": error}, status_code=status, headers={"cache-control": "no-store"})
