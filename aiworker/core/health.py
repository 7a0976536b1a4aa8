"""The one shape of a health report, shared by `doctor` and `runner doctor` so that one
script reads both: {"ok": ..., "checks": [{"name", "status", "detail"}]}, where status
is ok, warn or fail and any fail makes the report fail (exit 1). Kept free of the store
and the forge so the runner host imports nothing heavy for it."""

from __future__ import annotations

from dataclasses import dataclass

from aiworker.core.report import Report
from aiworker.errors import EXIT_FAILED, EXIT_OK

STATUSES = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str


@dataclass
class HealthReport(Report):
    ok: bool
    checks: list[dict[str, str]]

    @classmethod
    def of(cls, checks: list[Check]) -> HealthReport:
        return cls(not any(c.status == "fail" for c in checks), [vars(c) for c in checks])

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_FAILED
