"""Describing the configuration with every secret redacted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiworker.config.loader import LoadedConfig, identities_of, token_state
from aiworker.core.report import Report
from aiworker.secrets import redact_url_password


@dataclass
class ConfigReport(Report):
    path: str
    exists: bool
    revision: str
    config: dict[str, Any]
    tokens: dict[str, dict[str, Any]]


def describe_config(loaded: LoadedConfig) -> ConfigReport:
    """The effective configuration; token sources are named, token values never appear."""
    document = loaded.config.model_dump(mode="json")
    tokens = {}
    for name, identity in identities_of(loaded.config):
        state = token_state(identity, loaded.path.parent)
        source = (
            f"env:{identity.token_env}" if identity.token_env else f"file:{identity.token_file}"
        )
        tokens[name] = {"source": source, "present": state == "present", "state": state}
    for section in (document["database"], document.get("forge") or {}):
        if section.get("url"):
            section["url"] = redact_url_password(section["url"])
    for options in document.get("provider_options", {}).values():
        if options.get("base_url"):
            options["base_url"] = redact_url_password(options["base_url"])
    return ConfigReport(str(loaded.path), loaded.exists, loaded.revision, document, tokens)
