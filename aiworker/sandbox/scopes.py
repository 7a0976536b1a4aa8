"""Scoped access tokens, as Forgejo checks them: a token holds scopes such as
`read:issue` or `write:repository` (`all`: every one; a write scope holds its read), and
each API route needs its category's scope, read for GET and HEAD and write otherwise,
before anything else of the route runs. A token that lacks it is refused with 403 and
Forgejo's words naming the scope. Git over HTTP needs the repository scope: read to
fetch, write to push. The users' own tokens (sandbox seed) hold `all`; POST
/users/{username}/tokens (api_people.py) makes a scoped one."""

from __future__ import annotations

from aiworker.sandbox.http import HttpError

CATEGORIES = (
    "activitypub",
    "admin",
    "issue",
    "misc",
    "notification",
    "organization",
    "package",
    "repository",
    "user",
)
KNOWN = {"all", *(f"{level}:{c}" for c in CATEGORIES for level in ("read", "write"))}
REFUSAL = "token does not have at least one of required scope(s)"
ISSUE_PARTS = ("issues", "labels", "milestones")
# The first part of a path outside /repos, and the categories its routes need.
GROUPS = {
    "user": ["user"],
    "orgs": ["organization"],
    "admin": ["admin"],
    "notifications": ["notification"],
    "packages": ["package"],
}


def categories(path: str) -> list[str]:
    """The scope categories API PATH needs (by Forgejo's route groups); none for
    /version, /settings/..., a user's public profile and token creation (which takes
    basic authentication, no token)."""
    parts = [*path.strip("/").split("/"), "", "", ""]
    if parts[0] == "repos":
        issues = parts[1] == "issues" or parts[3] in ISSUE_PARTS
        return ["issue"] if issues else ["repository"]
    listing = parts[0] in ("user", "users") and "repos" in parts[1:3]
    return [*GROUPS.get(parts[0], []), *(["repository"] if listing else [])]


def require(held: list[str], needed: list[str], method: str) -> None:
    """Refuse (403) when HELD lacks the scope each category NEEDED takes for METHOD."""
    level = "read" if method in ("GET", "HEAD") else "write"
    for category in needed:
        wanted = {f"write:{category}"} | ({f"read:{category}"} if level == "read" else set())
        if "all" not in held and not wanted & set(held):
            raise HttpError(403, f"{REFUSAL}: [{level}:{category}]")
