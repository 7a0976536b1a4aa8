"""Typed forge errors carrying method, path and status; never a token."""

from __future__ import annotations

from aiworker.errors import AiworkerError, Unavailable


class ForgeError(AiworkerError):
    code = "forge_error"

    def __init__(self, method: str, path: str, status: int | None, detail: str = "") -> None:
        self.method = method
        self.path = path
        self.status = status
        where = f"{method} {path}"
        what = f"HTTP {status}" if status is not None else "no response"
        super().__init__(
            f"forge request {where} failed: {what}" + (f": {detail}" if detail else "")
        )


class ForgeUnavailable(ForgeError):
    """Connection failures, 429 and 5xx that outlasted the retries: try again later."""

    code = "forge_unavailable"
    exit_code = Unavailable.exit_code


class ForgeNotFound(ForgeError):
    code = "forge_not_found"


class ForgeForbidden(ForgeError):
    code = "forge_forbidden"


class ForgeConflict(ForgeError):
    code = "forge_conflict"


class ForgeInvalid(ForgeError):
    code = "forge_invalid"


BY_STATUS: dict[int, type[ForgeError]] = {
    403: ForgeForbidden,
    404: ForgeNotFound,
    405: ForgeConflict,
    409: ForgeConflict,
    422: ForgeInvalid,
}
