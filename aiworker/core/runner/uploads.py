"""The runner's side of an artifact transfer: ask the controller how much of the payload
it holds, send the rest in chunks from there, and go on after a lost connection or a
restarted controller from whatever it then says it holds. A log the controller refuses
(too large, damaged twice) is left out of the result, which still carries its tail."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import Any

from aiworker.adapters.runner_api import CHUNK_BYTES, LeaseGone, ServerUnavailable
from aiworker.contracts.native_job import ArtifactRef
from aiworker.core.runner.controllers import Controller
from aiworker.errors import AiworkerError, InvalidInput

log = logging.getLogger(__name__)
BACKOFF_CAP_S = 30.0
LOG_MEDIA_TYPE = "text/plain; charset=utf-8"


class Stopped(AiworkerError):
    code = "runner_stopped"


def _hash(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            sha.update(block)
    return sha.hexdigest()


def keep_logs(
    controller: Controller,
    pair: tuple[int, int],
    token: str,
    deadline_s: float,
    cancel: threading.Event,
    logs: list[tuple[str, Path]],
) -> list[ArtifactRef]:
    """Send each (name, path) of LOGS within DEADLINE_S, until CANCEL; what was sent, to
    name in the result. A log that cannot be sent (the controller away, refused, a local
    error) is left out and said so: the result still goes, with the tails. Only the
    lease's end (LeaseGone) ends the job here."""
    give_up = time.monotonic() + deadline_s
    sent = []
    for name, path in logs:
        try:
            ref = ArtifactRef(
                name=name, sha256=_hash(path), size=path.stat().st_size, media_type=LOG_MEDIA_TYPE
            )
            _send(controller, pair, token, ref, path, (give_up, cancel))
        except LeaseGone:
            raise
        except (AiworkerError, OSError) as exc:
            why = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            log.warning("worker job %d/%d: %s not sent: %s", *pair, name, why)
            continue
        sent.append(ref)
    return sent


def _send(
    controller: Controller,
    pair: tuple[int, int],
    token: str,
    ref: ArtifactRef,
    path: Path,
    until: tuple[float, threading.Event],
) -> None:
    give_up, cancel = until
    delay, restarted = 1.0, False
    # From the start, as most transfers are new: a controller that holds more answers
    # offset_mismatch, and the sender asks how much.
    state: dict[str, Any] | None = {"received": 0, "complete": False}
    with open(path, "rb") as handle:
        while True:
            if cancel.is_set():
                raise Stopped("the runner was stopped")
            if time.monotonic() > give_up:
                raise ServerUnavailable(f"{ref['name']} was not received in time")
            try:
                if state is None:
                    state = controller.artifact_state(pair, token, ref["sha256"])
                    if state["received"]:
                        log.info(
                            "worker job %d/%d: %s goes on from byte %d of %d",
                            *pair,
                            ref["name"],
                            state["received"],
                            ref["size"],
                        )
                if state["complete"]:
                    return
                offset = int(state["received"])
                handle.seek(offset)
                chunk = handle.read(CHUNK_BYTES)
                state = controller.send_chunk(
                    pair, token, ref["sha256"], (offset, ref["size"]), chunk
                )
                delay = 1.0
            except ServerUnavailable as exc:
                if time.monotonic() + delay > give_up:
                    raise
                log.info("worker job %d/%d: %s; %s goes on later", *pair, exc.message, ref["name"])
                time.sleep(delay)
                delay, state = min(delay * 2, BACKOFF_CAP_S), None
            except InvalidInput as exc:
                # Another sender of the same bytes moved the end on (ask again), or what
                # was held did not hash to the digest (dropped there: send it all again).
                if exc.code == "artifact_damaged" and not restarted:
                    restarted, state = True, None
                elif exc.code == "offset_mismatch":
                    state = None
                else:
                    raise
