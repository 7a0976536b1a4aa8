"""Health checks: configuration, tokens, the forge (reachable, each identity, each
repository), the last poll and the tick, state directory, its free space, database,
git, qemu, KVM."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from aiworker.config.loader import (
    LoadedConfig,
    identities_of,
    load_config,
    read_token,
    token_path,
    token_state,
    why_no_token,
)
from aiworker.core.context import Environment, state_dir_mode
from aiworker.core.health import Check, HealthReport
from aiworker.core.maintenance.storage import storage_check
from aiworker.core.tasks.hosts import clock_skew_problem
from aiworker.errors import AiworkerError
from aiworker.runtime.processes import run_command, which
from aiworker.store.engine import sqlite_path
from aiworker.store.schema import HEAD_REVISION, current_revision, ensure_not_newer, schema_drift


def run_doctor(state_dir: Path, config_path: Path) -> HealthReport:
    return HealthReport.of(_checks(state_dir, config_path))


def _checks(state_dir: Path, config_path: Path) -> list[Check]:
    checks: list[Check] = []
    try:
        loaded = load_config(config_path, required=True)
    except AiworkerError as exc:
        checks.append(Check("config", "fail", exc.message))
        details = getattr(exc, "problems", [])
        checks.extend(Check("config", "fail", line) for line in details)
        return [*checks, _check_state_dir(state_dir), _check_git(), *_check_guests()]
    checks.append(_check_config(loaded))
    checks.extend(_check_tokens(loaded))
    if loaded.config.forge is not None:
        checks.append(_check_operator(loaded))
    from aiworker.core.maintenance.forge_health import forge_checks, scheduler_checks

    env = Environment(state_dir, loaded)
    checks.extend(forge_checks(env))
    checks.extend(scheduler_checks(env))
    checks.extend(_check_providers(env))
    checks.append(_check_state_dir(state_dir))
    checks.append(storage_check(env))
    checks.append(_check_database(env))
    if checks[-1].status == "ok":
        from aiworker.core.maintenance.retention import artifacts_check

        checks.append(artifacts_check(env))
    checks.append(_check_git())
    checks.extend(_check_guests())
    from aiworker.core.guests.health import guest_findings

    checks.extend(Check(*finding) for finding in guest_findings(Environment(state_dir, loaded)))
    return checks


def _check_providers(env: Environment) -> list[Check]:
    """Each configured provider's quota signal, read as admission reads it (no inference):
    one that cannot be read is not admitted until it can."""
    from aiworker.core.providers.registry import read_provider

    if not env.loaded.config.providers:
        return [Check("providers", "warn", "none configured: inference is suspended")]
    now = datetime.now(UTC)
    checks = []
    for name in env.loaded.config.providers:
        try:
            reading, _ = read_provider(env, name, now)
        except AiworkerError as exc:
            checks.append(Check(f"provider:{name}", "fail", exc.message))
            continue
        if reading.valid:
            checks.append(Check(f"provider:{name}", "ok", f"readable ({reading.source})"))
        else:
            why = f"{reading.reason} ({reading.source}); not admitted until it can be read"
            checks.append(Check(f"provider:{name}", "warn", f"its signal cannot be read: {why}"))
    return checks


def _check_config(loaded: LoadedConfig) -> Check:
    repos = len(loaded.config.repositories)
    return Check("config", "ok", f"{loaded.path} is valid ({repos} repositories)")


def _check_tokens(loaded: LoadedConfig) -> list[Check]:
    checks = []
    for name, identity in identities_of(loaded.config):
        base = loaded.path.parent
        source = f"${identity.token_env}" if identity.token_env else str(identity.token_file)
        state = token_state(identity, base)
        if state == "missing":
            why = why_no_token(identity, base)
            checks.append(Check(f"token:{name}", "fail", f"no token readable: {why}"))
        elif state == "malformed":
            checks.append(
                Check(f"token:{name}", "fail", f"{source} must hold exactly one token on one line")
            )
        elif name.startswith("runner-") and len(read_token(identity, base) or "") < 32:
            checks.append(
                Check(f"token:{name}", "fail", f"{source}: a runner token needs 32 characters")
            )
        elif identity.token_file and (mode := _mode(token_path(identity, base))) & 0o077:
            checks.append(
                Check(
                    f"token:{name}",
                    "fail",
                    f"{source} is readable by others (mode {mode:04o}); chmod 600 it",
                )
            )
        else:
            checks.append(Check(f"token:{name}", "ok", f"token present in {source}"))
    return checks


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def _check_operator(loaded: LoadedConfig) -> Check:
    assert loaded.config.forge is not None
    if loaded.config.forge.identities.operator is not None:
        return Check("operator", "ok", "an operator identity reads collaborators' permissions")
    return Check(
        "operator",
        "warn",
        "no forge.identities.operator: Forgejo shows other users' permissions only to admins, "
        "so only the repository owner and the bot identities can authorise work",
    )


def _check_state_dir(state_dir: Path) -> Check:
    mode = state_dir_mode(state_dir)
    if mode is None:
        return Check("state-dir", "warn", f"{state_dir} does not exist yet; it will be created")
    if not os.access(state_dir, os.W_OK | os.X_OK):
        return Check("state-dir", "fail", f"{state_dir} is not writable by this user")
    if os.stat(state_dir).st_uid != os.getuid():
        return Check("state-dir", "fail", f"{state_dir} is owned by another user")
    if mode & 0o077:
        return Check("state-dir", "warn", f"{state_dir} has mode {mode:04o}; 0700 is expected")
    return Check("state-dir", "ok", f"{state_dir} (mode {mode:04o})")


# A database farther away than this slows every tick: a claim is a few round trips.
SLOW_ROUND_TRIP_MS = 25


def _check_database(env: Environment) -> Check:
    path = sqlite_path(env.database_url)
    if path is not None and not path.exists():
        return Check("database", "warn", f"no database at {path}; run `aiworker db upgrade`")
    try:
        db = env.open_database(require_current=False)
        try:
            revision = current_revision(db)
            engine, round_trip_ms = db.server()
            skewed = clock_skew_problem(db)
            drift = schema_drift(db) if revision == HEAD_REVISION else []
        finally:
            db.dispose()
        ensure_not_newer(revision)
    except AiworkerError as exc:
        return Check("database", "fail", exc.message)
    except Exception as exc:
        return Check("database", "fail", f"cannot open: {type(exc).__name__}")
    where = f"{engine}, round trip {round_trip_ms:.1f} ms"
    if skewed is not None:
        return Check("database", skewed[0], f"{where}: {skewed[1]}")
    if drift:
        return Check(
            "database",
            "fail",
            f"{where}: schema at {revision}, but its tables differ from this version's: "
            + "; ".join(drift[:5]),
        )
    return _database_verdict(where, revision, round_trip_ms)


def _database_verdict(where: str, revision: str | None, round_trip_ms: float) -> Check:
    if revision != HEAD_REVISION:
        return Check(
            "database", "fail", f"{where}: at revision {revision}; run `aiworker db upgrade`"
        )
    if round_trip_ms > SLOW_ROUND_TRIP_MS:
        return Check(
            "database",
            "warn",
            f"{where} (over {SLOW_ROUND_TRIP_MS} ms: every claim and step pays several); "
            f"schema at {revision}",
        )
    return Check("database", "ok", f"{where}; schema at {revision}")


def _check_git() -> Check:
    result = run_command(["git", "--version"], timeout=10)
    if not result.ok:
        return Check("git", "fail", "git is not installed or does not run")
    return Check("git", "ok", result.stdout.strip())


def _check_guests() -> list[Check]:
    qemu = which("qemu-system-x86_64")
    if qemu is None:
        qemu_check = Check("qemu", "warn", "qemu-system-x86_64 not found; guest phases unavailable")
    else:
        version = run_command([qemu, "--version"], timeout=10).stdout.splitlines()
        qemu_check = Check("qemu", "ok", version[0] if version else qemu)
    return [qemu_check]
