"""The artifact store: content-addressed payloads that are whole and verified before
anything names them, and the records of who refers to them."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import threading

import pytest

from aiworker.runtime.artifact_files import ArtifactDamaged, ArtifactFiles
from tests.helpers import run_process
from tests.test_implement import FIX, SCRIPT_ONLY, query, result_doc

PAYLOAD = b"evidence\n" * 1000
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()


def test_a_payload_is_kept_under_its_digest_privately_and_once(tmp_path):
    files = ArtifactFiles(tmp_path / "artifacts")
    assert files.put(PAYLOAD) == (DIGEST, len(PAYLOAD))
    assert files.put(PAYLOAD) == (DIGEST, len(PAYLOAD))
    path = files.path(DIGEST)
    assert path == tmp_path / "artifacts" / "sha256" / DIGEST[:2] / DIGEST
    assert path.read_bytes() == PAYLOAD
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    assert stat.S_IMODE((tmp_path / "artifacts").stat().st_mode) == 0o700
    assert files.usage() == (1, len(PAYLOAD))
    assert os.listdir(tmp_path / "artifacts" / "partial") == []  # no temporary left
    with pytest.raises(ValueError, match="not a SHA-256"):
        files.path("../../etc/passwd")


def test_a_payload_that_no_longer_matches_its_digest_is_refused_on_read(tmp_path):
    files = ArtifactFiles(tmp_path)
    files.put(PAYLOAD)
    path = files.path(DIGEST)
    path.chmod(0o600)
    path.write_bytes(PAYLOAD[:-1] + b"X")
    with pytest.raises(ArtifactDamaged, match=DIGEST):
        files.read(DIGEST)


RECEIVER = """
import sys
from pathlib import Path
from aiworker.runtime.artifact_files import ArtifactFiles
files = ArtifactFiles(Path(sys.argv[1]))
digest, size, start, stop = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
data = Path(sys.argv[6]).read_bytes()
held = files.received(digest)
print("resumed at", held, flush=True)
for offset in range(held, min(stop, size), 1000):
    files.receive(digest, offset, data[offset:min(offset + 1000, size)])
if files.received(digest) == size:
    files.complete(digest, size)
    print("published", flush=True)
"""


def test_a_transfer_goes_on_from_what_a_killed_receiver_kept_and_is_published_only_whole(
    tmp_path,
):
    source = tmp_path / "source"
    source.write_bytes(PAYLOAD)
    root = tmp_path / "artifacts"

    def receive(stop: int) -> str:
        argv = [str(root), DIGEST, str(len(PAYLOAD)), "0", str(stop), str(source)]
        done = subprocess.run(
            [sys.executable, "-c", RECEIVER, *argv], capture_output=True, text=True, check=True
        )
        return done.stdout

    assert receive(4000) == "resumed at 0\n"
    files = ArtifactFiles(root)
    assert not files.has(DIGEST)  # a part is never published
    assert files.received(DIGEST) == 4000
    with pytest.raises(ValueError, match="4000 bytes are held"):
        files.receive(DIGEST, 3000, PAYLOAD[3000:4000])
    assert files.received(DIGEST) == 4000
    assert receive(len(PAYLOAD)) == "resumed at 4000\npublished\n"
    assert files.read(DIGEST) == PAYLOAD
    assert os.listdir(root / "partial") == []


def test_a_transfer_whose_bytes_do_not_match_is_dropped_not_published(tmp_path):
    files = ArtifactFiles(tmp_path)
    files.receive(DIGEST, 0, PAYLOAD[:-1] + b"X")
    with pytest.raises(ArtifactDamaged):
        files.complete(DIGEST, len(PAYLOAD))
    assert not files.has(DIGEST)
    assert files.received(DIGEST) == 0  # the sender starts again


def test_two_senders_of_the_same_bytes_take_turns_and_publish_them_once(tmp_path):
    from aiworker.core.runner.transfers import receive_chunk, transfer_state
    from aiworker.errors import InvalidInput

    files = ArtifactFiles(tmp_path)
    payload = os.urandom(64 * 1024)
    digest = hashlib.sha256(payload).hexdigest()
    start = threading.Barrier(4)
    refused: list[str] = []

    def send() -> None:
        start.wait()
        state = {"received": 0, "complete": False}
        while not state["complete"]:
            offset = state["received"]
            try:
                chunk = payload[offset : offset + 1000]
                state = receive_chunk(files, digest, offset, len(payload), chunk)
            except InvalidInput as exc:
                refused.append(exc.code)
                if exc.code != "offset_mismatch":
                    return
                state = transfer_state(files, digest)

    senders = [threading.Thread(target=send) for _ in range(4)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(timeout=60)
    assert not any(sender.is_alive() for sender in senders)
    assert set(refused) <= {"offset_mismatch"}  # ask again, never damaged
    assert files.read(digest) == payload
    assert os.listdir(tmp_path / "partial") == []


def test_an_attempt_keeps_its_prompt_and_result_in_the_store(claimed, upgraded, state_dir):
    task = claimed(SCRIPT_ONLY, edits={"calc.py": FIX}, result=result_doc())
    assert run_process("--json", "implement", "--task", str(task), "--slot", "1").exit_code == 0
    rows = query(
        upgraded,
        "select name, sha256, size, attempt_id, expires_at > created_at from artifacts "
        "where attempt_id is not null order by id",
    )
    assert [r[0] for r in rows][:2] == ["prompt.md", "result.json"]
    files = ArtifactFiles(state_dir / "artifacts")
    for _name, digest, size, attempt, later in rows:
        assert (len(files.read(digest)), later) == (size, 1)
        assert attempt is not None
    # The commits it made, as the bundle that brought them: they outlive the workspace.
    [bundle] = [r for r in rows if r[0] == "result.bundle"]
    saved = state_dir / "result.bundle"
    saved.write_bytes(files.read(bundle[1]))
    listed = subprocess.run(
        ["git", "bundle", "list-heads", str(saved)], capture_output=True, text=True, check=True
    )
    assert "refs/heads/work" in listed.stdout
