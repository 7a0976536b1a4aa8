"""Which execution backend a phase or check gets, from `execution.backend`: `qemu` or
`local`; unset, `qemu` wherever an image is provisioned and QEMU is installed, else
`local` for the `script` provider alone. Isolation fails closed: a real agent runs on
this host only where `local` was chosen, and there only in bubblewrap unless
`execution.local_unsandboxed` says otherwise; what it must not read is hidden."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from aiworker.config.loader import identities_of, token_path
from aiworker.core.context import Environment
from aiworker.core.guests.paths import guests_root
from aiworker.errors import InvalidInput
from aiworker.runtime.guests.images import Image, ImageStore
from aiworker.runtime.processes import which
from aiworker.runtime.workspace import ExecutionBackend, LocalBackend
from aiworker.store.engine import sqlite_path

TOOLS = ("qemu-system-x86_64", "qemu-img", "socat")
# Folders a configuration may lie in that the rest of the system needs.
SHARED_FOLDERS = frozenset(
    Path(p)
    for p in ("/", "/etc", "/tmp", "/var", "/opt", "/usr", "/root", "/home", "/srv")  # noqa: S108
)
# Logins in the home of the user aiworker runs as, for other programs (git over SSH or
# HTTPS, PostgreSQL, clouds, registries): no job reads them.
HOME_LOGINS = (
    ".ssh",
    ".git-credentials",
    ".config/git/credentials",
    ".netrc",
    ".pgpass",
    ".aws",
    ".docker",
    ".gnupg",
    ".kube",
    ".config/gh",
)
# Replays scenarios with a helper of ours: no agent runs, so it may run on the host.
HOST_SAFE = frozenset({"script"})


def guest_store(env: Environment) -> ImageStore:
    return ImageStore(guests_root(env))


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if which(tool) is None]


def backend_choice(env: Environment) -> tuple[str, str]:
    """(backend, why)."""
    configured = env.loaded.config.execution.backend
    if configured is not None:
        return configured, "execution.backend says so"
    missing = missing_tools()
    if missing:
        return "local", f"{', '.join(missing)} not installed"
    image = guest_store(env).current()
    if image is None:
        return "local", "no guest image is provisioned (`aiworker qemu provision`)"
    return "qemu", f"the guest image {image.name} is provisioned"


def isolation_refusal(env: Environment, provider: str) -> str | None:
    """Why PROVIDER may not run now for want of isolation, with the fix; None when it may.
    A provider pointed at a scenario replays it with the script provider's helper (a dry
    run of that slot): no agent runs, so it is as safe as `script`."""
    options = env.loaded.config.provider_options.get(provider)  # type: ignore[call-overload]
    if provider in HOST_SAFE or (options is not None and options.scenario):
        return None
    backend, why = backend_choice(env)
    if backend == "qemu":
        return None
    execution = env.loaded.config.execution
    if execution.backend is None:
        return (
            f"{provider} would run on this host ({why}): provision a guest image "
            '(`aiworker qemu provision`) or set execution.backend = "local"'
        )
    if which("bwrap") is None and not execution.local_unsandboxed:
        return (
            f"{provider} would run on this host without bubblewrap: install bubblewrap, or "
            "set execution.local_unsandboxed = true (unsafe: the agent can read every "
            "token, the database and the configuration)"
        )
    return None


def provider_homes(env: Environment) -> list[Path]:
    """Every place a provider keeps its login: hidden from the other providers' runs."""
    homes = [env.state_dir / "providers"]
    for options in env.loaded.config.provider_options.values():
        if options.home:
            home = Path(options.home).expanduser()
            homes.append(home if home.is_absolute() else env.loaded.path.parent / home)
    return homes


def written_places(env: Environment) -> list[Path]:
    """Where jobs write besides the state directory and the providers' homes: a SQLite
    database's folder and the guests' folder, when they lie elsewhere."""
    database = sqlite_path(env.database_url)
    places = [database.parent if database is not None else None, guests_root(env)]
    return [p.absolute() for p in places if p is not None]


def host_secrets(env: Environment) -> list[Path]:
    """What a job on this host must not read: the state directory (the database, runner
    and web keys, logs), the configuration's folder, every token file it names and the
    logins of other programs in this user's home (HOME_LOGINS). A folder shared with the
    rest of the system (/etc, a home, /tmp) or holding the Python that runs aiworker is
    not hidden, only the configuration file in it."""
    config_file = env.loaded.path.expanduser().absolute()
    folder = config_file.parent
    runtime = Path(sys.prefix).absolute()
    shared = folder in SHARED_FOLDERS or folder == Path.home().absolute()
    keep_folder = shared or folder == runtime or folder in runtime.parents
    secrets = [env.state_dir.absolute(), config_file if keep_folder else folder]
    for _name, identity in identities_of(env.loaded.config):  # the runners' tokens too
        if identity.token_file:
            secrets.append(token_path(identity, folder).absolute())
    database = sqlite_path(env.database_url)  # a SQLite store kept elsewhere
    if database is not None and env.state_dir.absolute() not in database.absolute().parents:
        secrets += [Path(f"{database.absolute()}{end}") for end in ("", "-wal", "-shm")]
    home = Path.home().absolute()
    return secrets + [home / name for name in HOME_LOGINS if (home / name).exists()]


def backend_for(env: Environment, phase: str) -> ExecutionBackend:
    """The backend for one phase (its egress allowlist is the phase's own)."""
    if backend_choice(env)[0] == "local":
        return LocalBackend()
    from aiworker.runtime.guests.backend import QemuBackend

    return QemuBackend(*_guest_parts(env, phase))


def checks_place(env: Environment) -> Any:
    """Where repository checks run instead of plainly on this host: a guest
    (GuestChecks) when the backend is qemu; with the local backend, bubblewrap hiding
    the host's secrets and every provider's login (SandboxedChecks) when it is
    installed; None without it."""
    if backend_choice(env)[0] == "local":
        from aiworker.runtime.bubblewrap import installed
        from aiworker.runtime.host_checks import SandboxedChecks

        bwrap = installed()
        hidden = [*host_secrets(env), *provider_homes(env)]
        return SandboxedChecks(hidden, bwrap) if bwrap else None
    from aiworker.runtime.guests.checks import GuestChecks

    store, image, _, policy, settings, unavailable = _guest_parts(env, "ci")
    return GuestChecks(store, image, settings, policy, unavailable)


def _guest_parts(env: Environment, phase: str) -> tuple[Any, ...]:
    from aiworker.runtime.guests.backend import GuestSettings
    from aiworker.runtime.guests.egress import EgressPolicy
    from aiworker.runtime.guests.machine import MachineSpec

    execution = env.loaded.config.execution
    store = guest_store(env)
    image = store.current()
    if image is not None and execution.cache_layer:
        image = image.with_layer(execution.cache_layer)
    policy = EgressPolicy(
        hosts=tuple(execution.allowlist(phase)), trusted=tuple(execution.trusted_networks)
    )
    machine = MachineSpec(execution.memory_mib, execution.cpus, accel_of(image))
    settings = GuestSettings(
        machine=machine,
        boot_deadline_s=execution.boot_deadline_s,
        setup_timeout_s=execution.setup_timeout_s,
        artifacts=env.state_dir / "artifacts",
    )
    return store, image, phase, policy, settings, why_unavailable(image)


def accel_of(image: Image | None) -> str:
    return str(image.manifest().get("accel", "tcg")) if image is not None else "tcg"


def why_unavailable(image: Image | None) -> str | None:
    missing = missing_tools()
    if missing:
        return f"execution.backend is qemu, but {', '.join(missing)} is not installed"
    if image is None:
        return (
            "execution.backend is qemu, but no guest image is provisioned: "
            "run `aiworker qemu provision`"
        )
    if image.layer and not image.restorable:
        return f"execution.cache_layer {image.layer} is not provisioned (qemu provision --layer)"
    return None


def require_image(env: Environment, *, layered: bool = True) -> tuple[ImageStore, Image]:
    """The current image (with the configured cache layer, when LAYERED); without one
    (or QEMU), the operator's to act on: InvalidInput, not a wait that cures itself."""
    store = guest_store(env)
    image = store.current()
    layer = env.loaded.config.execution.cache_layer if layered else None
    if image is not None and layer:
        image = image.with_layer(layer)
    reason = why_unavailable(image)
    if reason is not None or image is None:
        why = (reason or "").replace("execution.backend is qemu, but ", "")
        raise InvalidInput(why, code="not_provisioned")
    return store, image
