"""Strict, bounded configuration models. Unknown keys are errors, never ignored."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Annotated, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from aiworker.config.database import DEFAULT_LEASE, Controller, Database
from aiworker.config.defaults import CHECK_INTERVAL, MIN_CHECK_INTERVAL
from aiworker.config.identities import Identities, Identity
from aiworker.config.limits import Budgets, Deadlines, Housekeeping, Retention, Storage
from aiworker.config.strict import Strict

T = TypeVar("T")

PROVIDER_NAMES = ("codex", "claude", "kimi", "deepseek", "opencode", "llama", "script")
ProviderName = Literal["codex", "claude", "kimi", "deepseek", "opencode", "llama", "script"]
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# One line of text that is not blank: a name, a label, a path (no control characters,
# which would split a log line or a header, and something besides spaces).
ONE_LINE = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"
BASE_URL = r"^https?://[^\s/?#]+(/\S*)?$"
# What such a pattern asks for, in an operator's words (the loader says it, not the regex).
PATTERN_WORDS = {
    ONE_LINE: "must be one line of text, not blank",
    BASE_URL: "must be http(s)://HOST[:PORT][/PATH]",
}


class Forge(Strict):
    url: Annotated[str, Field(pattern=r"^https?://[^\s/]+(/[^\s]*)?$")]
    identities: Identities = Identities()
    timeout_seconds: Annotated[float, Field(gt=0, le=300)] = 30.0

    @field_validator("url")
    @classmethod
    def _reachable(cls, value: str) -> str:
        """A URL requests can reach: a host, a port that is a number in range, no query."""
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
        except ValueError as exc:
            raise ValueError(f"not a usable URL ({exc})") from None
        if not parts.hostname or parts.query or parts.fragment:
            raise ValueError("must be http(s)://HOST[:PORT][/PATH], with no query or fragment")
        return value


class Web(Strict):
    """The web plane as others reach it. PUBLIC_URL: the origin an authenticated reverse
    proxy serves it under (https://NAME[:PORT], no path); the CI status links its receipt
    page there, and `web serve` accepts requests that name it. Unset: no link is posted."""

    public_url: str | None = None

    @field_validator("public_url")
    @classmethod
    def _origin(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
            or parts.username
            or parts.password
        ):
            raise ValueError("must be an origin such as https://aiworker.example.org[:PORT]")
        # As a browser names it in Host: the host in lower case, no default port.
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        default = {"http": 80, "https": 443}[parts.scheme]
        port = f":{parts.port}" if parts.port not in (None, default) else ""
        return f"{parts.scheme}://{host}{port}"


class Repository(Strict):
    index: Annotated[int, Field(ge=1, le=2**31 - 1)]
    owner: Annotated[str, Field(min_length=1, max_length=100)]
    name: Annotated[str, Field(min_length=1, max_length=100)]

    @field_validator("owner", "name")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("may contain only letters, digits, '.', '_' and '-'")
        if value in (".", ".."):
            raise ValueError("may not be '.' or '..'")
        return value

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


class ProviderPhaseSettings(Strict):
    enabled: bool = True
    # At most what an attempt's record holds (PostgreSQL enforces it, SQLite would not).
    model: Annotated[str, Field(max_length=100, pattern=ONE_LINE)] | None = None
    effort: Literal["minimal", "low", "medium", "high", "xhigh", "max"] | None = None


# The effort levels each CLI accepts (claude's --help; codex's model_reasoning_effort;
# deepseek runs through claude). A provider missing here takes no effort setting; the
# script provider stands in for any of them.
EFFORTS: dict[str, tuple[str, ...]] = {
    "codex": ("minimal", "low", "medium", "high", "xhigh"),
    "claude": ("low", "medium", "high", "xhigh", "max"),
    "deepseek": ("low", "medium", "high", "xhigh", "max"),
    "script": ("minimal", "low", "medium", "high", "xhigh", "max"),
}


class PhaseSettings(Strict):
    providers: dict[ProviderName, ProviderPhaseSettings] = {}

    @model_validator(mode="after")
    def _effort_per_provider(self) -> PhaseSettings:
        for name, settings in self.providers.items():
            accepted = EFFORTS.get(name, ())
            if settings.effort is None or settings.effort in accepted:
                continue
            if not accepted:
                raise ValueError(f"{name} takes no effort setting (got {settings.effort!r})")
            raise ValueError(
                f"{name} does not accept effort {settings.effort!r}; "
                f"it accepts {', '.join(accepted)}"
            )
        return self


class Phases(Strict):
    planning: PhaseSettings = PhaseSettings()
    implementation: PhaseSettings = PhaseSettings()
    review: PhaseSettings = PhaseSettings()
    # Layered over implementation for milestones marked simple and minor review fixes.
    simple_implementation: PhaseSettings = PhaseSettings()


class LocalBounds(Strict):
    """llama: the bounds of its one local try, enforced by aiworker's gate between the
    agent and the server (the agent's own requests are not trusted)."""

    # Tokens one request may generate (the server's max_tokens / n_predict).
    tokens_per_request: Annotated[int, Field(ge=16, le=1_000_000)] = 1024
    # Tokens all requests of the try may generate together.
    tokens_per_try: Annotated[int, Field(ge=16, le=10_000_000)] = 8192
    # Chat requests the try may make.
    requests_per_try: Annotated[int, Field(ge=1, le=10_000)] = 24
    # Wall time of the try, from the agent's start to its end.
    seconds_per_try: Annotated[int, Field(ge=10, le=86_400)] = 900
    # The largest prompt a request may carry (tokens); the agent is told it as its limit.
    context_tokens: Annotated[int, Field(ge=512, le=10_000_000)] = 16384


class ProviderOptions(Strict):
    """Provider-specific settings; each provider reads the ones it documents."""

    # script: the scenario file replayed instead of a model (dry runs, demo, tests).
    scenario: Annotated[str, Field(pattern=ONE_LINE)] | None = None
    # llama: the llama.cpp server; deepseek/kimi: an API base URL override.
    base_url: Annotated[str, Field(pattern=BASE_URL)] | None = None
    # deepseek: a paid key must be enabled explicitly.
    paid_enabled: bool = False
    # The CLI's private configuration home (CODEX_HOME, CLAUDE_CONFIG_DIR, KIMI_CODE_HOME);
    # default $STATE_DIR/providers/NAME.
    home: Annotated[str, Field(pattern=ONE_LINE)] | None = None
    # deepseek: the environment variable holding the key.
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "DEEPSEEK_API_KEY"
    # opencode: the verified zero-spend budget guard (JSON).
    guard: Annotated[str, Field(pattern=ONE_LINE)] | None = None
    # llama: the most changed lines (added + removed) its one local try may produce.
    diff_budget_lines: Annotated[int, Field(ge=1, le=100_000)] = 200
    # llama: the bounds of that try (tokens, requests, seconds, context).
    bounds: LocalBounds = LocalBounds()
    # Seconds after which a quota reading is stale.
    max_reading_age: Annotated[int, Field(ge=1, le=86_400)] = 600


class Labels(Strict):
    """Label names that mark work; configurable per installation."""

    plan: Annotated[str, Field(max_length=100, pattern=ONE_LINE)] = "aiworker-plan"
    feature: Annotated[str, Field(max_length=100, pattern=ONE_LINE)] = "aiworker-feature"
    # Marks work small enough for simple_implementation settings and the local model.
    simple: Annotated[str, Field(max_length=100, pattern=ONE_LINE)] = "aiworker-simple"
    # A writer applies it to a plan issue to approve the posted plan.
    approved: Annotated[str, Field(max_length=100, pattern=ONE_LINE)] = "aiworker-approved"

    @model_validator(mode="after")
    def _distinct(self) -> Labels:
        """Each label means one thing: a plan's label that also approved it would approve
        every plan as it is asked for."""
        seen: dict[str, str] = {}
        for key in ("plan", "feature", "simple", "approved"):
            name = getattr(self, key)
            if name in seen:
                raise ValueError(f"{seen[name]} and {key} are both {name!r}: name each its own")
            seen[name] = key
        return self


class Planning(Strict):
    # The most milestones a plan may propose; a plan with more is not accepted.
    max_milestones: Annotated[int, Field(ge=1, le=32)] = 8
    # A writer's comment that is exactly this (case and surrounding space aside) approves.
    approve_command: Annotated[str, Field(min_length=2, max_length=100, pattern=ONE_LINE)] = (
        "/aiworker approve"
    )


def phases_among(known: tuple[str, ...]) -> Callable[[dict[str, T]], dict[str, T]]:
    """A check that a table's keys name only phases among KNOWN."""

    def check(value: dict[str, T]) -> dict[str, T]:
        unknown = set(value) - set(known)
        if unknown:
            raise ValueError(f"unknown phases {sorted(unknown)}; known: {', '.join(known)}")
        return value

    return check


PHASES = ("plan", "implement", "repair", "review", "publish", "merge", "milestones")


class Scheduler(Strict):
    # direct: the tick starts slot jobs itself (cron, shells); systemd: it starts
    # aiworker-slot@N.service, so jobs live in their own units.
    launcher: Literal["direct", "systemd"] = "direct"
    # A job the scheduler started that made progress asks for the next check at once;
    # false leaves every check to the timer.
    follow_up: bool = True
    # Replaces `aiworker <phase>` for a phase (a wrapper script, a dry run);
    # `--task ID --slot N` are appended.
    phase_commands: dict[str, Annotated[list[str], Field(min_length=1)]] = {}

    _known = field_validator("phase_commands")(phases_among(PHASES))

    @field_validator("phase_commands")
    @classmethod
    def _a_program_first(cls, commands: dict[str, list[str]]) -> dict[str, list[str]]:
        for phase, argv in commands.items():
            if not argv[0].strip():
                raise ValueError(f"{phase}: its first word must name the program to run")
        return commands


class Runners(Strict):
    # The tokens runners present (Authorization: Bearer), each from a file or a variable.
    tokens: Annotated[list[Identity], Field(max_length=64)] = []
    # How long a claim holds a job without a heartbeat, and how many leases it gets.
    lease_seconds: Annotated[int, Field(ge=5, le=3600)] = 60
    max_attempts: Annotated[int, Field(ge=1, le=20)] = 3
    # Who runs CI and gate checks: the controller's own embedded runner, or the fleet of
    # `runner serve` processes (then a job nobody finishes within its timeout plus
    # queue_seconds is ended as failed).
    mode: Literal["embedded", "fleet"] = "embedded"
    queue_seconds: Annotated[int, Field(ge=10, le=7 * 86_400)] = 1800


EGRESS_PHASES = ("default", "planning", "implementation", "review", "repair", "setup", "ci")
HOST_PATTERN = r"^(\*\.)?[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$|^[0-9a-fA-F:.]{2,45}$"


class Execution(Strict):
    """Where phases and checks run: `qemu` (a disposable guest of the provisioned image)
    or `local` (a directory on this host); unset, `qemu` wherever an image is
    provisioned and QEMU is installed, else only the `script` provider runs (on this host):
    a real agent runs on the host only where `local` is chosen."""

    backend: Literal["qemu", "local"] | None = None
    # Unsafe: lets a real agent run on this host without bubblewrap (backend = "local"),
    # where it can read everything this user can: tokens, the database, other logins.
    local_unsandboxed: bool = False
    # Images, overlays and running guests; default $STATE_DIR/guests.
    guests_dir: Annotated[str, Field(pattern=ONE_LINE)] | None = None
    memory_mib: Annotated[int, Field(ge=256, le=262_144)] = 1024
    cpus: Annotated[int, Field(ge=1, le=64)] = 2
    # The guest's root filesystem (the image recipe's DISK_SIZE).
    disk_size: Annotated[str, Field(pattern=r"^[1-9][0-9]{0,5}[MG]$")] = "8G"
    boot_deadline_s: Annotated[int, Field(ge=10, le=3600)] = 180
    # The repository's own ci/setup, run in the guest before any credential is there.
    setup_timeout_s: Annotated[int, Field(ge=10, le=86_400)] = 1800
    # The image recipe's inputs.
    suite: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{1,30}$")] = "bookworm"
    mirror: Annotated[str, Field(pattern=r"^https?://\S+$")] = "http://deb.debian.org/debian"
    extra_packages: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9+.-]{0,99}$")]] = []
    # Hosts a guest may reach through the egress proxy, per phase ("default" applies to
    # every phase not named): exact names, "*.suffix", or literal addresses; ports 80
    # and 443 only. Empty: the guest reaches nothing.
    egress: dict[str, list[Annotated[str, Field(pattern=HOST_PATTERN)]]] = {}
    # Networks the proxy reaches although they are not public (an internal mirror).
    trusted_networks: list[str] = []
    # Start every guest from this cache layer of the current image (qemu provision --layer).
    cache_layer: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,31}$")] | None = None

    _phases = field_validator("egress")(phases_among(EGRESS_PHASES))

    @field_validator("trusted_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as exc:
                raise ValueError(f"{network!r} is not a network: {exc}") from exc
        return value

    def allowlist(self, phase: str) -> list[str]:
        return self.egress.get(phase, self.egress.get("default", []))


class Config(Strict):
    forge: Forge | None = None
    repositories: list[Repository] = []
    shares: Annotated[int, Field(ge=1, le=3)] = 1
    check_interval: Annotated[int, Field(ge=MIN_CHECK_INTERVAL, le=86_400)] = CHECK_INTERVAL
    providers: list[ProviderName] = []
    provider_options: dict[ProviderName, ProviderOptions] = {}
    phases: Phases = Phases()
    reserve_percent: Annotated[float, Field(ge=0, lt=100)] = 10.0
    # None inherits reserve_percent.
    weekly_reserve_percent: Annotated[float, Field(ge=0, lt=100)] | None = None
    database: Database = Database()
    controller: Controller = Controller()
    labels: Labels = Labels()
    planning: Planning = Planning()
    scheduler: Scheduler = Scheduler()
    budgets: Budgets = Budgets()
    housekeeping: Housekeeping = Housekeeping()
    storage: Storage = Storage()
    retention: Retention = Retention()
    deadlines: Deadlines = Deadlines()
    runners: Runners = Runners()
    execution: Execution = Execution()
    web: Web = Web()

    @model_validator(mode="after")
    def _unique(self) -> Config:
        indexes = [r.index for r in self.repositories]
        if len(set(indexes)) != len(indexes):
            raise ValueError("repositories: each index must be unique")
        names = [r.full_name.lower() for r in self.repositories]
        if len(set(names)) != len(names):
            raise ValueError("repositories: each owner/name must appear once")
        if len(set(self.providers)) != len(self.providers):
            raise ValueError("providers: each provider may appear once")
        if self.repositories and self.forge is None:
            raise ValueError("forge: required when repositories are configured")
        if self.controller.lease is not None and self.controller.lease <= self.check_interval:
            # An idle controller renews only when it ticks: it would look gone between.
            raise ValueError(
                f"controller.lease ({self.controller.lease} s) must be longer than "
                f"check_interval ({self.check_interval} s)"
            )
        return self

    @property
    def controller_lease(self) -> int:
        """The lease as set, else one an idle controller's ticks renew in time."""
        if self.controller.lease is not None:
            return self.controller.lease
        return max(DEFAULT_LEASE, 3 * self.check_interval)

    @property
    def effective_weekly_reserve(self) -> float:
        if self.weekly_reserve_percent is None:
            return self.reserve_percent
        return self.weekly_reserve_percent
