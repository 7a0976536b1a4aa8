"""The stream recorder against a reference computed over the whole stream."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from aiworker.runtime.evidence import StreamRecorder, mask_secrets


@given(st.lists(st.binary(max_size=300), max_size=40), st.integers(min_value=0, max_value=500))
def test_any_chunking_gives_exact_hash_and_tail(chunks, tail):
    recorder = StreamRecorder(tail)
    for chunk in chunks:
        recorder.feed(chunk)
    digest = recorder.finish()
    whole = b"".join(chunks)
    assert digest.total_bytes == len(whole)
    assert digest.sha256 == hashlib.sha256(whole).hexdigest()
    assert digest.tail == (whole[-tail:] if tail else b"")
    assert digest.truncated == (len(whole) > tail)


def test_secret_is_masked_whole_and_when_cut_by_the_tail():
    secret = b"abcdef-123456"
    assert mask_secrets(b"x abcdef-123456 y", [secret]) == b"x *** y"
    # The tail starts inside the secret: its visible end is masked too.
    assert mask_secrets(b"123456 y", [secret]) == b"*** y"
    assert mask_secrets(b"56 y", [secret]) == b"56 y"  # too little of it to tell
    # A declared secret is masked whatever its length (the request said it is one).
    assert mask_secrets(b"pin=hk4#q done", [b"hk4#q"]) == b"pin=*** done"
    assert mask_secrets(b"a 1 b", [b"1"]) == b"a *** b"
    assert mask_secrets(b"nothing", [b""]) == b"nothing"  # the floor: one byte


def test_masking_is_flagged_only_when_it_changed_the_tail():
    recorder = StreamRecorder(64)
    recorder.feed(b"value: hunter2-hunter2\n")
    assert recorder.finish([b"hunter2-hunter2"]).masked is True
    clean = StreamRecorder(64)
    clean.feed(b"nothing here\n")
    assert clean.finish([b"hunter2-hunter2"]).masked is False
