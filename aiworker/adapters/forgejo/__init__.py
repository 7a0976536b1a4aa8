"""The one Forgejo client: REST over requests, with retries, pagination and typed models."""

from aiworker.adapters.forgejo.client import ForgejoClient
from aiworker.adapters.forgejo.errors import ForgeError, ForgeUnavailable

__all__ = ["ForgeError", "ForgeUnavailable", "ForgejoClient"]
