"""Core statements compiled once per dialect and run on the DB-API connection.

For the statements on the hottest path (a claim: select, compare-and-update,
event) SQLAlchemy's per-execution work (execution context, result wrapping,
events, its transaction object) costs more than SQLite spends running them, and
with several racing processes every microsecond is spent holding the write
lock. A DriverStatement is compiled from the same Core statement for the
connection's dialect, applies SQLAlchemy's own bind processors (UTC datetimes,
JSON), and executes on the raw cursor. benchmarks/claims measures the gain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

_REQUIRED = object()


@dataclass(frozen=True)
class DriverConnection:
    """A DB-API connection inside a transaction the caller owns, and its dialect."""

    dbapi: Any
    dialect: Dialect


def driver_of(connection: Connection) -> DriverConnection:
    """The DB-API connection under a SQLAlchemy connection, sharing its transaction."""
    return DriverConnection(connection.connection.dbapi_connection, connection.dialect)


@dataclass(frozen=True)
class _Parameter:
    name: str
    default: Any  # the statement's own value, or _REQUIRED
    process: Callable[[Any], Any] | None


@dataclass(frozen=True)
class _Compiled:
    sql: str
    parameters: tuple[_Parameter, ...]
    positional: bool


class DriverStatement:
    """One Core statement, executed without SQLAlchemy's per-call machinery."""

    def __init__(self, statement: ClauseElement, column_keys: Sequence[str] | None = None) -> None:
        self.statement = statement
        self.column_keys = list(column_keys) if column_keys is not None else None
        self._by_dialect: dict[tuple[str, str], _Compiled] = {}

    def prepare(self, dialect: Dialect) -> None:
        """Compile for DIALECT now, outside any transaction."""
        self._compiled(dialect)

    def _compiled(self, dialect: Dialect) -> _Compiled:
        key = (dialect.name, dialect.paramstyle)
        found = self._by_dialect.get(key)
        if found is not None:
            return found
        compiled = cast(
            SQLCompiler, self.statement.compile(dialect=dialect, column_keys=self.column_keys)
        )
        if compiled.post_compile_params or compiled.literal_execute_params:
            # IN lists are expanded per execution by SQLAlchemy; bind each value instead.
            raise ValueError("a DriverStatement cannot hold IN lists: bind each value")
        # Positional: one entry per placeholder, repeats included. Named: each name once;
        # binds also holds anonymous keys, bind_names maps each parameter to its rendered name.
        names = (
            list(compiled.positiontup or ())
            if compiled.positional
            else list(dict.fromkeys(compiled.bind_names.values()))
        )
        parameters = []
        for name in names:
            bind = compiled.binds[name]
            default = _REQUIRED if bind.required or bind.value is None else bind.value
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            parameters.append(_Parameter(name, default, process))
        found = _Compiled(compiled.string, tuple(parameters), bool(compiled.positional))
        self._by_dialect[key] = found
        return found

    def execute(self, connection: DriverConnection, params: Mapping[str, Any]) -> Any:
        """Run inside CONNECTION's transaction; return the DB-API cursor."""
        compiled = self._compiled(connection.dialect)
        values = []
        for parameter in compiled.parameters:
            value = params.get(parameter.name, parameter.default)
            if value is _REQUIRED:
                raise KeyError(f"no value for parameter {parameter.name!r}")
            values.append(value if parameter.process is None else parameter.process(value))
        cursor = connection.dbapi.cursor()
        if compiled.positional:
            cursor.execute(compiled.sql, values)
        else:
            cursor.execute(
                compiled.sql, {p.name: v for p, v in zip(compiled.parameters, values, strict=True)}
            )
        return cursor
