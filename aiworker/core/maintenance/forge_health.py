"""What doctor asks the forge and the scheduler's record: is the forge there (and which
version), does it accept each identity's token (and as whom), may each bot write to
each repository (read with its own token, as the web plane's access check reads it),
does each bot's token hold the scopes its work needs, did the last poll work, and is the
tick running on time."""

from __future__ import annotations

from datetime import UTC, datetime

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.errors import ForgeError, ForgeTokenScope
from aiworker.config.identities import Identity
from aiworker.config.loader import read_token, token_source
from aiworker.core.context import Environment
from aiworker.core.health import Check
from aiworker.core.maintenance.access import BOTS, WRITE, permission_of
from aiworker.core.scheduler_state import SchedulerState
from aiworker.errors import AiworkerError

ROLES = (*BOTS, "operator")
# The token scopes each identity needs besides read:user (its identity check reads it),
# and what for (a write scope holds its read).
SCOPES = {
    "planner": {"read:repository": "fetch the code", "write:issue": "post plans"},
    "worker": {"write:repository": "push and open pull requests", "write:issue": "comment"},
    "reviewer": {"write:repository": "review and merge", "read:issue": "read issues"},
    "ci": {"write:repository": "post commit statuses"},
    "operator": {"read:repository": "read authors' permissions"},
}


def forge_checks(env: Environment) -> list[Check]:
    forge = env.loaded.config.forge
    if forge is None:
        return [Check("forge", "warn", "no forge configured (forge.url): nothing is polled")]
    clients = _clients(env)
    if not clients:
        return [Check("forge", "fail", "no identity has a readable token; see the token checks")]
    try:
        version = next(iter(clients.values()))[1].server_version()
    except ForgeError as exc:
        return [Check("forge", "fail", exc.message)]
    checks = [Check("forge", "ok", f"{forge.url} answers: version {version}")]
    logins: dict[str, tuple[str, ForgejoClient]] = {}
    for role, (identity, client) in clients.items():
        source = token_source(identity, env.loaded.path.parent)
        try:
            login = client.current_user().login
        except ForgeError as exc:
            refused = exc.status in (401, 403) and not isinstance(exc, ForgeTokenScope)
            detail = f"the forge refuses the token from {source}" if refused else exc.message
            checks.append(Check(f"identity:{role}", "fail", detail))
            continue
        logins[role] = (login, client)
        checks.append(Check(f"identity:{role}", "ok", f"{login}, configured as the {role}"))
    checks.extend(_repository_checks(env, logins))
    checks.extend(_scope_checks(env, logins))
    return checks


def _scope_checks(env: Environment, logins: dict[str, tuple[str, ForgejoClient]]) -> list[Check]:
    """Whether each bot's token holds the scopes its work needs, asked on the first
    repository with requests the forge refuses once it checked the scope."""
    repos = env.loaded.config.repositories
    checks = []
    for role, needs in SCOPES.items():
        if role not in logins or not repos:
            continue
        client = logins[role][1]
        try:
            lacking = [
                f"{scope} (to {why})"
                for scope, why in needs.items()
                if client.lacks_scope(repos[0].owner, repos[0].name, scope)
            ]
        except ForgeError as exc:
            checks.append(Check(f"scopes:{role}", "fail", exc.message))
            continue
        if lacking:
            detail = f"the token lacks {', '.join(lacking)}; give it those scopes on the forge"
            checks.append(Check(f"scopes:{role}", "fail", detail))
        else:
            checks.append(Check(f"scopes:{role}", "ok", f"holds {', '.join(needs)}"))
    return checks


def _clients(env: Environment) -> dict[str, tuple[Identity, ForgejoClient]]:
    forge = env.loaded.config.forge
    assert forge is not None
    clients = {}
    for role in ROLES:
        identity = getattr(forge.identities, role)
        try:
            token = read_token(identity, env.loaded.path.parent) if identity else None
        except AiworkerError:
            token = None  # a malformed token: the token check names it
        if identity is not None and token is not None:
            # Two tries, not five: doctor should answer within seconds.
            client = ForgejoClient(forge.url, token, timeout=forge.timeout_seconds, attempts=2)
            clients[role] = (identity, client)
    return clients


def _repository_checks(
    env: Environment, logins: dict[str, tuple[str, ForgejoClient]]
) -> list[Check]:
    checks = []
    bots = [(role, *logins[role]) for role in BOTS if role in logins]
    for repo in env.loaded.config.repositories:
        name = f"repository:{repo.full_name}"
        if not bots:
            checks.append(Check(name, "fail", "no bot identity the forge accepts"))
            continue
        try:
            archived = bots[0][2].repository(repo.owner, repo.name).archived
        except ForgeError as exc:
            checks.append(Check(name, "fail", exc.message))
            continue
        if archived:
            checks.append(Check(name, "fail", "archived on the forge: it takes no change"))
            continue
        found = {login: permission_of(client, repo, login) for _, login, client in bots}
        lacking = [f"{login} has {p}" for login, p in found.items() if p not in WRITE]
        if lacking:
            checks.append(Check(name, "fail", "; ".join(lacking) + " (each bot needs write)"))
        else:
            have = ", ".join(f"{login} {p}" for login, p in found.items())
            checks.append(Check(name, "ok", f"readable; {have}"))
    return checks


def scheduler_checks(env: Environment, now: datetime | None = None) -> list[Check]:
    """The last poll's outcome and whether the tick runs on time (a check older than
    twice the interval is overdue)."""
    now = now or datetime.now(UTC)
    state = SchedulerState.load(env.state_dir)
    checks = []
    if state.poll_failures:
        checks.append(
            Check(
                "poll",
                "fail",
                f"{state.poll_failures} polls in a row failed; the last at "
                f"{state.poll_error_at}: {state.poll_error}",
            )
        )
    elif env.loaded.config.forge is not None:
        checks.append(
            Check("poll", "ok", "the last poll worked" if state.last_check else "no poll yet")
        )
    interval = env.loaded.config.check_interval
    if state.paused:
        checks.append(
            Check("scheduler", "warn", f"paused: {state.paused_reason or 'no reason given'}")
        )
    elif state.last_check is None:
        checks.append(Check("scheduler", "warn", "no check recorded yet; is the timer enabled?"))
    else:
        age = now - (state.last_check_at() or now)
        if state.overdue(interval, now):
            checks.append(
                Check(
                    "scheduler",
                    "fail",
                    f"overdue: the last check was {int(age.total_seconds())} s ago "
                    f"(interval {interval} s); is the timer running?",
                )
            )
        else:
            checks.append(Check("scheduler", "ok", f"last check {int(age.total_seconds())} s ago"))
    return checks
