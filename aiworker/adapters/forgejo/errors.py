"""Typed forge errors carrying the forge's URL, method, path, status and cause; never a
token. The exit code says who can fix it: 75 when waiting can (a 5xx, 429, a timeout,
a refused connection: a forge restarting), 2 when the operator must (an unknown host
name, a TLS failure, a malformed URL, a token the forge refuses), 1 otherwise."""

from __future__ import annotations

from aiworker.errors import EXIT_INVALID, AiworkerError, Unavailable


class ForgeError(AiworkerError):
    code = "forge_error"
    advice = ""  # what to do, after the forge's own words

    def __init__(
        self, method: str, path: str, status: int | None, detail: str = "", *, forge: str = ""
    ) -> None:
        detail += self.advice
        self.method = method
        self.path = path
        self.status = status
        self.forge = forge
        where = f"{method} {path}" + (f" at {forge}" if forge else "")
        what = f"HTTP {status}" if status is not None else "no response"
        super().__init__(
            f"forge request {where} failed: {what}" + (f": {detail}" if detail else "")
        )


class ForgeUnavailable(ForgeError):
    """Connection failures, 429 and 5xx that outlasted the retries: try again later."""

    code = "forge_unavailable"
    exit_code = Unavailable.exit_code


class ForgeAnswerLost(ForgeUnavailable):
    """A change's answer was lost after its request went out (a 500, 502 or 504, a timeout,
    a broken connection): the forge may have made it. It is not sent again blindly; the
    client looks for what it made first (client.ForgejoClient._once)."""

    code = "forge_answer_lost"


class ForgeUnreachable(ForgeError):
    """The forge's address itself is wrong (an unknown host name after the retries, a TLS
    failure, a malformed URL): waiting does not help, the configuration must change."""

    code = "forge_unreachable"
    exit_code = EXIT_INVALID


class ForgeUnauthorized(ForgeError):
    """401: the forge does not accept the token."""

    code = "forge_unauthorized"
    exit_code = EXIT_INVALID
    installation = True


class ForgeBadAnswer(ForgeError):
    """A success whose body is not what the API says it is (an HTML login page from a
    proxy in front of the forge, a list where an object belongs)."""

    code = "forge_bad_answer"


class ForgeNotFound(ForgeError):
    code = "forge_not_found"


class ForgeForbidden(ForgeError):
    code = "forge_forbidden"


class ForgeTokenScope(ForgeForbidden):
    """403 for a token that lacks a scope the request needs (Forgejo's scoped tokens):
    only the operator can give it one, so no retry helps."""

    code = "forge_token_scope"
    exit_code = EXIT_INVALID
    installation = True
    holds_task = True
    advice = "; give this identity's token that scope (Forgejo: Settings > Applications)"


class ForgeLocked(ForgeError):
    """423: the repository is archived, and the forge takes no change to it until a
    person unarchives it: no retry helps."""

    code = "forge_locked"
    holds_task = True
    advice = "; a person must unarchive the repository on the forge, or cancel the task"


# Forgejo's words for a token without the scope a route needs.
SCOPE_REFUSAL = "token does not have at least one of required scope"


class ForgeConflict(ForgeError):
    code = "forge_conflict"


class ForgeInvalid(ForgeError):
    code = "forge_invalid"


BY_STATUS: dict[int, type[ForgeError]] = {
    401: ForgeUnauthorized,
    403: ForgeForbidden,
    404: ForgeNotFound,
    405: ForgeConflict,
    409: ForgeConflict,
    422: ForgeInvalid,
    423: ForgeLocked,
}
