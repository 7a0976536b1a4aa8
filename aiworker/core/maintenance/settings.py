"""Settings an operator may change from the web plane, and saving them like `config set`.

Which keys are editable comes from the configuration's own shape for the scheduler's
knobs, and from each provider's capability metadata (`editable_settings`) for provider
settings per phase, and the repositories (a save names those it adds, for an access
repair to provision alone); installation and identity fields (the forge, its tokens,
the database, provider options such as homes and scenarios) are read only here. A
change names dotted keys with JSON values; the whole resulting document is validated
before anything is written, the revision must still be the one read, and the file is
replaced atomically as a private file under the configuration's lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiworker.config.loader import LoadedConfig
from aiworker.config.models import Config, Phases
from aiworker.config.persist import current_config_bytes, edited, save_config_bytes
from aiworker.core.maintenance.configuration import describe_config
from aiworker.core.report import Report
from aiworker.errors import InvalidInput

GENERAL = (
    "repositories",  # new entries are provisioned with an access repair for them only
    "shares",
    "check_interval",
    "providers",
    "reserve_percent",
    "weekly_reserve_percent",
    "budgets.implementation",
    "budgets.repair",
    "budgets.planning",
    "budgets.review",
    "budgets.delivery",
    "planning.max_milestones",
    "housekeeping.retention_days",
    "retention.artifact_days",
)
READ_ONLY = ("forge", "database", "provider_options", "labels", "scheduler")
MAX_CHANGES = 64


@dataclass
class Capabilities(Report):
    general: list[str]
    providers: dict[str, list[str]]  # provider -> the settings it lets an operator change
    phases: list[str]
    read_only: list[str]
    # What each key takes, from the configuration's own schema: type, bounds, choices
    # (general keys by name, provider settings by setting name); a form is made from it.
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)
    provider_fields: dict[str, dict[str, Any]] = field(default_factory=dict)

    def editable(self) -> set[str]:
        keys = set(self.general)
        for provider, settings in self.providers.items():
            for phase in self.phases:
                keys |= {f"phases.{phase}.providers.{provider}.{s}" for s in settings}
        return keys


def capabilities() -> Capabilities:
    from aiworker.core.providers.registry import PROVIDER_CLASSES

    providers = {c.name: list(c.editable_settings) for c in PROVIDER_CLASSES}
    schema = Config.model_json_schema()
    settings = _resolve(schema, schema["$defs"]["ProviderPhaseSettings"])["properties"]
    return Capabilities(
        general=list(GENERAL),
        providers=providers,
        phases=list(Phases.model_fields),
        read_only=list(READ_ONLY),
        fields={key: _field(schema, _at(schema, key.split("."))) for key in GENERAL},
        provider_fields={
            name: _field(schema, settings[name])
            for name in sorted({s for names in providers.values() for s in names})
        },
    )


# What a form needs of each field; its default is what an unset field is shown as.
FIELD_FACTS = (
    "type",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "enum",
    "default",
)


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """NODE with its reference followed and an optional value's null choice set aside."""
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in node:
        values = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(values) < len(node["anyOf"])
        return {**_resolve(schema, values[0]), "nullable": nullable}
    return node


def _at(schema: dict[str, Any], path: list[str]) -> dict[str, Any]:
    node = schema
    for part in path:
        node = _resolve(schema, node)["properties"][part]
    return node


def _field(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    resolved = _resolve(schema, node)
    described = {k: resolved[k] for k in FIELD_FACTS if k in resolved}
    if resolved.get("nullable"):
        described["nullable"] = True
    items = _resolve(schema, resolved["items"]) if "items" in resolved else None
    if items is not None:
        described["items"] = {k: items[k] for k in FIELD_FACTS if k in items}
    return described


@dataclass
class SettingsReport(Report):
    revision: str
    config: dict[str, Any]
    tokens: dict[str, dict[str, Any]]


def read_settings(loaded: LoadedConfig) -> SettingsReport:
    described = describe_config(loaded)
    return SettingsReport(described.revision, described.config, described.tokens)


def added_repositories(loaded: LoadedConfig, values: dict[str, Any]) -> list[int]:
    """The indexes of repositories VALUES adds (what an access repair then provisions)."""
    given = values.get("repositories")
    if not isinstance(given, list):
        return []
    known = {r.index for r in loaded.config.repositories}
    return sorted(
        {e["index"] for e in given if isinstance(e, dict) and isinstance(e.get("index"), int)}
        - known
    )


def save_settings(loaded: LoadedConfig, revision: str, values: dict[str, Any]) -> str:
    """Apply VALUES (dotted key -> JSON value; None removes the key) to the file read at
    REVISION; returns the new revision. Nothing is written unless every key is editable
    and the whole result is a valid configuration."""
    if not values:
        raise InvalidInput("no values to save")
    if len(values) > MAX_CHANGES:
        raise InvalidInput(f"at most {MAX_CHANGES} values may be saved at once")
    editable = capabilities().editable()
    refused = sorted(key for key in values if key not in editable)
    if refused:
        raise InvalidInput(f"not editable here: {', '.join(refused)[:500]}")
    data = current_config_bytes(loaded.path)
    return save_config_bytes(loaded.path, edited(data, loaded.path, values), revision)
