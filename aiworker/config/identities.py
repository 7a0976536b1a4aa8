"""The forge identities and runner tokens: where each token is read from, never the
token itself."""

from __future__ import annotations

import re

from pydantic import ValidationInfo, field_validator, model_validator

from aiworker.config.strict import Strict

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A Forgejo access token (40 hex digits) or a key of that kind: no variable's or file's name
_A_TOKEN = re.compile(r"[0-9A-Fa-f]{32,}")


class Identity(Strict):
    """A forge identity. Its token is read from a file or an environment variable."""

    token_file: str | None = None
    token_env: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_inline_token(cls, data: object) -> object:
        if isinstance(data, dict) and "token" in data:
            # The value is never echoed: it is a secret in the wrong place.
            raise ValueError("inline tokens are not accepted; use token_file or token_env")
        return data

    @field_validator("token_file", "token_env")
    @classmethod
    def _names_a_token(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A name where the token is kept, not the token itself (which the error, `config
        show` and `doctor` would then print)."""
        if value is not None and not value.strip():
            raise ValueError("is empty: name the file or the environment variable")
        if value is not None and _A_TOKEN.fullmatch(value):
            raise ValueError(
                "looks like a token itself, not where one is kept (the value is not shown): "
                "put the token in a file or an environment variable and name that here"
            )
        if info.field_name == "token_env" and value is not None and not _ENV_NAME.match(value):
            raise ValueError("must be an environment variable name")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Identity:
        if (self.token_file is None) == (self.token_env is None):
            raise ValueError("set exactly one of token_file or token_env")
        return self


class Identities(Strict):
    planner: Identity | None = None
    worker: Identity | None = None
    reviewer: Identity | None = None
    # Admin identity used only to read other users' permissions (see discovery).
    operator: Identity | None = None
    # Posts the `aiworker / ci` commit statuses; without it the worker does.
    ci: Identity | None = None
