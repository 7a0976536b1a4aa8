"""The lease keeper: the runner's heartbeat thread for one job, which the job cannot
starve. It beats one at a time, each beat given no longer than the lease has left; it
wakes at the expiry itself; and when the controller refuses the lease (gone, or the
token refused) or no beat succeeded before it ran out and a last one is refused too (a
host frozen past the lease keeps a job nobody took over), it sets LOST and the job's
CANCEL, which kills the job at once."""

from __future__ import annotations

import logging
import threading
import time

from aiworker.adapters.runner_api import LeaseGone
from aiworker.core.runner.controllers import Controller
from aiworker.errors import Refused

log = logging.getLogger(__name__)


class LeaseKeeper(threading.Thread):
    """Heartbeats, one at a time, every interval (at most a third of the lease); sets
    CANCEL and LOST when the controller says the lease is gone or it expired unrenewed.
    LEASES: what the claim had left, and what each renewal gives (seconds)."""

    def __init__(
        self,
        controller: Controller,
        pair: tuple[int, int],
        token: str,
        leases: tuple[float, float],
        heartbeat_interval_s: float,
        cancel: threading.Event,
    ) -> None:
        super().__init__(daemon=True, name=f"lease-{pair[0]}-{pair[1]}")
        self.controller, self.pair, self.token, self.cancel = controller, pair, token, cancel
        # Counted on this host's clock (the controller's may differ), each less a margin
        # for the time the answer took to arrive.
        left, renewed = leases
        self.margin = min(2.0, renewed / 5)
        self.lease_s = renewed - self.margin
        self.expires = time.monotonic() + left - min(2.0, left / 5)
        self.interval = max(0.2, min(heartbeat_interval_s, renewed / 3))
        self.first_beat = max(0.2, min(self.interval, left / 3))
        self.done = threading.Event()
        self.lost = threading.Event()
        self.delivering = False  # a beat refused once the job is delivered is expected

    def run(self) -> None:
        next_beat = time.monotonic() + self.first_beat
        while not self.done.wait(max(0.0, min(next_beat, self.expires) - time.monotonic())):
            sent = time.monotonic()
            if sent >= self.expires:  # woken at the expiry itself, not a beat later
                if not self._late_beat(sent):
                    return
                next_beat = sent + self.interval
                continue
            if sent < next_beat:
                continue
            next_beat = sent + self.interval
            if not self._beat(sent):
                return

    def confirm(self) -> None:
        """One beat before the job starts, its renewal counted from when it was sent: the
        claim's answer may have come late (a slow or one-way network) and its lease began
        at the controller before that, so that counting it from the answer would run the
        job past it, beside the runner that claims it next. A beat that fails leaves the
        claim's lease, less its margin."""
        self._beat(time.monotonic())

    def _beat(self, sent: float) -> bool:
        """One heartbeat sent at SENT; False when the lease is refused (lost)."""
        try:
            # A beat that cannot be answered before the lease ends is not waited for.
            self.controller.heartbeat(self.pair, self.token, self.expires - sent)
            self.expires = sent + self.lease_s
        except (LeaseGone, Refused) as exc:
            if not self.delivering:
                self._lose(f"the controller refuses the lease: {exc.message}")
            return False
        except Exception as exc:  # any failed beat: the expiry decides
            log.warning("worker job %d/%d: heartbeat failed: %s", *self.pair, exc)
        return True

    def _late_beat(self, sent: float) -> bool:
        """The lease ran out on this host's clock (the host froze, or its beats could not
        get through): the controller decides. It keeps a lease nobody took over, so one
        last beat it accepts goes on with the job, finished work included; anything else
        ends it. True when the lease holds."""
        try:
            # Given no longer than the margin this host keeps before the controller's own
            # expiry: a runner cut off from it stops before another may start the job.
            self.controller.heartbeat(self.pair, self.token, max(0.5, self.margin))
        except (LeaseGone, Refused) as exc:
            if not self.delivering:
                self._lose(f"the lease expired and the controller refuses it: {exc.message}")
            return False
        except Exception as exc:
            self._lose(f"no heartbeat succeeded before the lease expired (last: {exc})")
            return False
        self.expires = sent + self.lease_s
        log.warning("worker job %d/%d: the lease was renewed late (this host stalled)", *self.pair)
        return True

    def _lose(self, why: str) -> None:
        log.warning("worker job %d/%d: %s; ending the job", *self.pair, why)
        self.lost.set()
        self.cancel.set()

    def stop(self) -> None:
        self.done.set()
        self.join()
