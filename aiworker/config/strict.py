"""The base of every configuration model: unknown keys are errors, types are not coerced,
values are frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
