"""What every listener's API shares: an application that serves its OpenAPI document
and no documentation pages, and the CLI's error shape as an HTTP answer,
`{"error": {"code", "message", "details"?}}`, masked, never cached."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from aiworker.secrets import redact


def api_app(title: str, openapi_url: str) -> FastAPI:
    from aiworker import __version__

    return FastAPI(
        title=title, version=__version__, openapi_url=openapi_url, docs_url=None, redoc_url=None
    )


def error_response(
    status: int, code: str, message: str, details: list[str] | None = None
) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": redact(message)}
    if details:
        error["details"] = [redact(d) for d in details]
    return JSONResponse({"error": error}, status_code=status, headers={"cache-control": "no-store"})
