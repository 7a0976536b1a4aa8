"""A process whose wall clock is AIWORKER_TEST_CLOCK_SHIFT_S seconds off, as after the
host's clock was stepped (an NTP correction, a resumed VM, `date -s`): time.time and
datetime's now are shifted, and the clocks that count real time (monotonic, boottime) are
left as they are, as a step leaves them. Put on PYTHONPATH for one subprocess."""

import datetime as _datetime
import os
import time as _time

_SHIFT = float(os.environ.get("AIWORKER_TEST_CLOCK_SHIFT_S", "0") or 0)

if _SHIFT:
    _real_time, _real_time_ns = _time.time, _time.time_ns
    _time.time = lambda: _real_time() + _SHIFT
    _time.time_ns = lambda: _real_time_ns() + int(_SHIFT * 1e9)

    class _Shifted(_datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls.fromtimestamp(_time.time(), tz)

        @classmethod
        def utcnow(cls):
            return cls.now(_datetime.UTC).replace(tzinfo=None)

        @classmethod
        def today(cls):
            return cls.now()

    _Shifted.__name__ = _Shifted.__qualname__ = "datetime"
    _Shifted.__module__ = "datetime"
    _datetime.datetime = _Shifted
