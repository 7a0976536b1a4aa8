"""JSON-lines logs on stderr, carrying run, task and attempt ids, with secrets masked."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
import uuid

from aiworker.secrets import redact

RUN_ID = uuid.uuid4().hex[:12]
task_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("task_id", default=None)
attempt_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("attempt_id", default=None)


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "run": RUN_ID,
        }
        if (task := task_id.get()) is not None:
            line["task"] = task
        if (attempt := attempt_id.get()) is not None:
            line["attempt"] = attempt
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return redact(json.dumps(line, default=str))


def configure(verbose: int) -> None:
    root = logging.getLogger("aiworker")
    root.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING)
    root.propagate = False
