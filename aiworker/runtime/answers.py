"""An HTTP answer read whole, as it came, within a deadline and a size.

A read timeout bounds each read, not the answer: a server that sends a byte at a time
never trips it. So the body is read with `read1` (what one read brings) and the
deadline is looked at between reads. It is read as it is: a compressed answer can
trickle in blocks that decode to nothing, and a small one can decode to gigabytes.
The forge's transport and the providers' admission checks read their answers here.
"""

from __future__ import annotations

import time

import requests

CHUNK = 64 * 1024


class AnswerRefused(Exception):
    """An answer not read: compressed, or larger than asked for (the message says which)."""


class AnswerLate(AnswerRefused):
    """An answer that did not arrive whole in time."""


def read_whole(response: requests.Response, *, started: float, seconds: float, limit: int) -> bytes:
    """The body of the streamed RESPONSE, whole by STARTED + SECONDS (time.monotonic) and
    at most LIMIT bytes; the response is closed either way. urllib3's own errors pass."""
    try:
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", ""):
            raise AnswerRefused(f"the answer is {encoding}-encoded, though asked for as it is")
        data = bytearray()
        while chunk := response.raw.read1(CHUNK, decode_content=False):
            data += chunk
            if len(data) > limit:
                raise AnswerRefused(f"the answer is larger than {limit} bytes")
            if time.monotonic() > started + seconds:
                raise AnswerLate(f"the answer did not arrive whole within {seconds:g} s")
        return bytes(data)
    finally:
        response.close()
