"""Logs: every line with a UTC timestamp and, where there is one, the task, attempt and
job ids; secrets masked.

Three places, chosen by where stderr goes:
- a log file (a job or tick the scheduler started, AIWORKER_LOG_STAMP=1): text lines,
  `2026-12-02T12:33:01.123Z warning task=3 attempt=7 run=... logger: message`, and every
  line the command prints is stamped too;
- the journal (JOURNAL_STREAM names our stderr, as under a systemd unit): the native
  protocol, with AIWORKER_TASK, AIWORKER_ATTEMPT, AIWORKER_JOB and AIWORKER_RUN fields;
- anything else (an operator's terminal, `-v`): JSON lines.

Stages of long work inside a command (a first fetch of a whole repository) are logged
to PROGRESS: in a terminal without --json they are shown as plain lines whatever the
verbosity; elsewhere they are ordinary info records.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import time
import uuid
from typing import Any, TextIO

from aiworker.secrets import redact

RUN_ID = uuid.uuid4().hex[:12]
STAMP_ENV = "AIWORKER_LOG_STAMP"
PROGRESS = "aiworker.progress"
JOURNAL_SOCKET = "/run/systemd/journal/socket"
task_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("task_id", default=None)
attempt_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("attempt_id", default=None)
# A runner's worker job: "REPOSITORY_INDEX/WORKER_JOB_INDEX".
job_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("job_id", default=None)


def stamp(when: float | None = None) -> str:
    """UTC to the millisecond: 2026-12-02T12:33:01.123Z."""
    when = time.time() if when is None else when
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + f".{int(when % 1 * 1000):03d}Z"


def ids() -> dict[str, Any]:
    """The ids of what this process works on now."""
    found: dict[str, Any] = {}
    for name, var in (("task", task_id), ("attempt", attempt_id), ("job", job_id)):
        if (value := var.get()) is not None:
            found[name] = value
    return {**found, "run": RUN_ID}


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": stamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **ids(),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return redact(json.dumps(line, default=str))


class TextLineFormatter(logging.Formatter):
    """One line for a log file: its time, level and ids first."""

    def format(self, record: logging.LogRecord) -> str:
        named = " ".join(f"{k}={v}" for k, v in ids().items())
        text = f"{stamp(record.created)} {record.levelname.lower()} {named} {record.name}: "
        text += record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return redact(text)


class StampedStream:
    """A text stream whose every line begins with the time it was written."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw
        self.at_line_start = True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self.at_line_start:
                out.append(stamp() + " ")
            out.append(piece)
            self.at_line_start = piece.endswith("\n")
        self.raw.write("".join(out))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class JournalHandler(logging.Handler):
    """Records sent to journald over its native protocol, their ids as fields."""

    PRIORITY = {"DEBUG": 7, "INFO": 6, "WARNING": 4, "ERROR": 3, "CRITICAL": 2}

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        import socket  # only under systemd: not on every command's start-up path

        super().__init__()
        self.path = path
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def emit(self, record: logging.LogRecord) -> None:
        message = redact(record.getMessage())
        if record.exc_info:
            message += "\n" + redact(logging.Formatter().formatException(record.exc_info))
        fields = {
            "MESSAGE": message,
            "PRIORITY": str(self.PRIORITY.get(record.levelname, 6)),
            "SYSLOG_IDENTIFIER": "aiworker",
            "LOGGER": record.name,
            **{f"AIWORKER_{k.upper()}": str(v) for k, v in ids().items()},
        }
        try:
            self.socket.sendto(journal_datagram(fields), self.path)
        except OSError:
            sys.stderr.write(TextLineFormatter().format(record) + "\n")


def journal_datagram(fields: dict[str, str]) -> bytes:
    """FIELDS in journald's native format (a value with a newline goes length-prefixed)."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode()
        if b"\n" in data:
            out += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


def stderr_is_journal() -> bool:
    """JOURNAL_STREAM (DEVICE:INODE, set by systemd) names the stream stderr is."""
    named = os.environ.get("JOURNAL_STREAM", "")
    try:
        info = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return named == f"{info.st_dev}:{info.st_ino}"


def configure(verbose: int, json_mode: bool = False) -> None:
    root = logging.getLogger("aiworker")
    root.handlers.clear()
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING
    handler: logging.Handler
    if os.environ.get(STAMP_ENV) == "1":
        stamped: Any = sys.stderr
        if not isinstance(stamped, StampedStream):
            stamped = StampedStream(sys.stderr)
            sys.stdout = StampedStream(sys.stdout)
            sys.stderr = stamped
        handler = logging.StreamHandler(stamped.raw)
        handler.setFormatter(TextLineFormatter())
        level = min(level, logging.INFO)  # a log file says what happened, not only failures
    elif stderr_is_journal():
        handler = JournalHandler(os.environ.get("AIWORKER_JOURNAL_SOCKET", JOURNAL_SOCKET))
        level = min(level, logging.INFO)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLineFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
    _show_progress(isinstance(handler.formatter, JsonLineFormatter) and not json_mode)


def _show_progress(human: bool) -> None:
    """In a terminal, stages of long work are shown as they begin, as plain lines."""
    progress = logging.getLogger(PROGRESS)
    progress.handlers.clear()
    terminal = human and sys.stderr.isatty()
    if terminal:
        shown = logging.StreamHandler(sys.stderr)
        shown.setFormatter(logging.Formatter("aiworker: %(message)s"))
        progress.addHandler(shown)
    progress.setLevel(logging.INFO if terminal else logging.NOTSET)
    progress.propagate = not terminal
