"""Where the store is, and this controller's place among those sharing it."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from aiworker.config.strict import Strict


class Database(Strict):
    # None means SQLite at $STATE_DIR/aiworker.db.
    url: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        """A URL the store can open: SQLite with a path, or PostgreSQL through psycopg (the
        driver aiworker ships) with a well-formed address. Never repeated in the error: it
        may carry a password."""
        if value is None:
            return value
        if re.match(r"^sqlite(\+pysqlite)?://", value):
            if not re.match(r"^sqlite(\+pysqlite)?:///.", value):
                raise ValueError("a SQLite URL names its file: sqlite:///PATH (three slashes)")
            path = value.split(":///", 1)[1]
            if not path.startswith("/"):
                # A relative path is read from wherever the command runs (a unit, cron):
                # another file each time; one in memory keeps nothing.
                raise ValueError(
                    "a SQLite URL names its file by an absolute path: "
                    "sqlite:////ABSOLUTE/PATH (four slashes)"
                )
            return value
        if not re.match(r"^postgresql(\+psycopg)?://", value):
            raise ValueError(
                "must be sqlite:///PATH or a postgresql:// URL naming HOST[:PORT]/DATABASE "
                "(the driver is psycopg)"
            )
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises for a port that is not a number in range
        except ValueError:
            raise ValueError(
                "is not a well-formed PostgreSQL URL (its host, or its port as a number)"
            ) from None
        credentials = parts.netloc.rpartition("@")[0]
        if "@" in credentials or any(c.isspace() for c in credentials):
            # The driver splits at the first '@', and a space ends a URL where text is
            # masked: either would show part of the password as the host, or all of it.
            raise ValueError(
                "its user or password holds '@' or a space: percent-encode them (%40, %20)"
            )
        return value


DEFAULT_LEASE = 300


class Controller(Strict):
    """This host among the controllers that share one (PostgreSQL) database."""

    # None means the host name. Claims and attempts record it; status shows it.
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")] | None = None
    # Seconds another controller waits after this one's last sign of life (every tick and
    # every running job renews it) before it recovers this one's claims and attempts. None
    # means 300 s, or three check intervals when those are longer (Config.controller_lease).
    lease: Annotated[int, Field(ge=10, le=86_400)] | None = None
