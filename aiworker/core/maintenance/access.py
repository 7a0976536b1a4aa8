"""Repository access for the bot identities: check it, and repair what is missing.

"Check" reads, with each bot's own token, its permission on each configured repository.
"Repair" grants a missing Write (never admin) with a token the operator gives for that
one call (the owner's or an admin's; it is never stored, and it is masked in anything
said), then reads each bot's permission again with its own token. A repair runs under
its own nonblocking lock and only against the settings revision the operator saw, so a
concurrent save is not provisioned blindly. A failure leaves the saved settings as they
are and comes back as a sanitised warning.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.errors import ForgeError
from aiworker.config.models import Repository
from aiworker.core.context import Environment
from aiworker.core.forge_access import ForgeAccess
from aiworker.core.report import Report
from aiworker.errors import AiworkerError, ConfigInvalid, Conflict, LockHeld
from aiworker.secrets import redact, register_secret

WRITE = ("write", "admin", "owner")
BOTS = ("planner", "worker", "reviewer", "ci")


@dataclass
class AccessReport(Report):
    revision: str
    access: list[dict[str, Any]] = field(default_factory=list)
    granted: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def permission_of(client: ForgejoClient, repo: Repository, login: str) -> str:
    try:
        return client.collaborator_permission(repo.owner, repo.name, login).permission
    except (ForgeError, AiworkerError) as exc:
        return f"unreadable: {redact(getattr(exc, 'message', str(exc)))[:200]}"


def _bots(access: ForgeAccess) -> list[tuple[str, str, ForgejoClient]]:
    """(role, login, client) of each configured bot identity."""
    return [
        (role, access.logins[role], client)
        for role in BOTS
        if (client := access.optional(role)) is not None
    ]


def _read(access: ForgeAccess, repos: Iterable[Repository]) -> list[dict[str, Any]]:
    found = []
    for repo in repos:
        for role, login, client in _bots(access):
            permission = permission_of(client, repo, login)
            found.append(
                {
                    "repository": repo.full_name,
                    "index": repo.index,
                    "role": role,
                    "login": login,
                    "permission": permission,
                    "ok": permission in WRITE,
                }
            )
    return found


def check_access(env: Environment) -> AccessReport:
    # A check the operator asked for and can ask again: a stalled forge costs each read
    # one timeout, not its retries.
    access = ForgeAccess(env.loaded, attempts=1)
    return AccessReport(env.loaded.revision, _read(access, env.loaded.config.repositories))


def repair_access(
    env: Environment, revision: str, admin_token: str, indexes: list[int] | None = None
) -> AccessReport:
    """Grant Write where a bot lacks it on the repositories of INDEXES (all when None)."""
    register_secret(admin_token)
    lock = env.locks.lock("access")
    if not lock.try_acquire():
        raise LockHeld("an access repair is already running")
    try:
        if env.loaded.revision != revision:
            raise Conflict(
                f"the settings changed since revision {revision[:12]} "
                f"(now {env.loaded.revision[:12]}); re-read them and try again"
            )
        config = env.loaded.config
        if config.forge is None:
            raise ConfigInvalid("forge: not configured")
        repos = [r for r in config.repositories if indexes is None or r.index in indexes]
        unknown = sorted(set(indexes or []) - {r.index for r in repos})
        if unknown:
            raise ConfigInvalid(f"no configured repository has index {unknown[0]}")
        access = ForgeAccess(env.loaded)
        admin = ForgejoClient(config.forge.url, admin_token, timeout=config.forge.timeout_seconds)
        report = AccessReport(revision)
        for entry in _read(access, repos):
            if entry["ok"]:
                continue
            repo = next(r for r in repos if r.index == entry["index"])
            try:
                admin.add_collaborator(repo.owner, repo.name, entry["login"], "write")
                report.granted.append({k: entry[k] for k in ("repository", "role", "login")})
            except (ForgeError, AiworkerError) as exc:
                message = getattr(exc, "message", str(exc))
                warning = (
                    f"{entry['repository']}: could not grant {entry['login']} write: {message}"
                )
                report.warnings.append(redact(warning)[:300])
        report.access = _read(access, repos)
        for entry in report.access:
            if not entry["ok"]:
                report.warnings.append(
                    f"{entry['repository']}: {entry['login']} still has {entry['permission']}"
                )
        return report
    finally:
        lock.release()
