"""The CLI's error shape as an HTTP answer, for every listener: `{"error": {"code",
"message", "details"?}}`, masked, never cached."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from aiworker.secrets import redact


def error_response(
    status: int, code: str, message: str, details: list[str] | None = None
) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": redact(message)}
    if details:
        error["details"] = [redact(d) for d in details]
    return JSONResponse({"error": error}, status_code=status, headers={"cache-control": "no-store"})
