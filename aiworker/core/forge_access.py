"""Forge clients for the configured identities, built from the configuration."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from aiworker.adapters.forgejo import ForgejoClient
from aiworker.adapters.forgejo.errors import ForgeError
from aiworker.config.identities import Identity
from aiworker.config.loader import LoadedConfig, read_token, token_source, why_no_token
from aiworker.errors import ConfigInvalid


@dataclass
class ForgeAccess:
    loaded: LoadedConfig
    # Tries of each request; None: the transport's own (retried with back-off). One for
    # what an operator waits on and can do without: a stalled forge then costs one timeout.
    attempts: int | None = None

    def _client(self, role: str, identity: Identity | None) -> ForgejoClient | None:
        forge = self.loaded.config.forge
        if forge is None or identity is None:
            return None
        token = read_token(identity, self.loaded.path.parent)
        if token is None:
            why = why_no_token(identity, self.loaded.path.parent)
            raise ConfigInvalid(f"forge.identities.{role}: no token readable: {why}")
        if self.attempts is not None:
            return ForgejoClient(
                forge.url, token, timeout=forge.timeout_seconds, attempts=self.attempts
            )
        return ForgejoClient(forge.url, token, timeout=forge.timeout_seconds)

    def required(self, role: str) -> ForgejoClient:
        client = self.optional(role)
        if client is None:
            raise ConfigInvalid(f"forge.identities.{role}: required for this command")
        return client

    def optional(self, role: str) -> ForgejoClient | None:
        return self._clients.get(role)

    def status_role(self) -> str:
        """Who posts the CI commit statuses: the `ci` identity, else the worker."""
        return "ci" if self.optional("ci") is not None else "worker"

    def status_writer(self) -> ForgejoClient:
        return self.required(self.status_role())

    @cached_property
    def _clients(self) -> dict[str, ForgejoClient]:
        forge = self.loaded.config.forge
        if forge is None:
            raise ConfigInvalid("forge: not configured")
        ids = forge.identities
        built = {}
        for role, identity in (
            ("planner", ids.planner),
            ("worker", ids.worker),
            ("reviewer", ids.reviewer),
            ("operator", ids.operator),
            ("ci", ids.ci),
        ):
            client = self._client(role, identity)
            if client is not None:
                built[role] = client
        return built

    def token(self, role: str) -> str:
        """The role's token, for git over HTTP (never logged: the redactor knows it)."""
        forge = self.loaded.config.forge
        identity = getattr(forge.identities, role, None) if forge else None
        token = read_token(identity, self.loaded.path.parent) if identity else None
        if token is None:
            why = why_no_token(identity, self.loaded.path.parent) if identity else "none set"
            raise ConfigInvalid(f"forge.identities.{role}: no token readable: {why}")
        return token

    def bots(self) -> dict[str, ForgejoClient]:
        """The bot identities by login (never the operator)."""
        return {
            self.logins[role]: client
            for role, client in self._clients.items()
            if role != "operator"
        }

    @cached_property
    def logins(self) -> dict[str, str]:
        """Each configured identity's login, read once from the forge; a rejected token is
        named by its identity and source (never its value)."""
        logins = {}
        for role, client in self._clients.items():
            try:
                logins[role] = client.current_user().login
            except ForgeError as exc:
                if exc.status not in (401, 403):
                    raise
                identity = getattr(self.loaded.config.forge.identities, role)  # type: ignore[union-attr]
                source = token_source(identity, self.loaded.path.parent)
                raise ConfigInvalid(
                    f"forge.identities.{role}: the forge rejected the token from {source} "
                    f"({exc.message})"
                ) from None
        return logins
