"""A runner's downloads over a network that breaks: a snapshot file whose transfer the
network or a restarting controller cut short is fetched again, whole, instead of ending
the job as failed; one that stays broken fails after the last try."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Event

import pytest

from aiworker.adapters.runner_api import RunnerApi, ServerUnavailable
from aiworker.core.runner.controllers import RemoteController

PACK = bytes(range(256)) * 4096  # 1 MiB


class Cutting(BaseHTTPRequestHandler):
    """Serves PACK, but cuts the first CUTS transfers off half-way (the connection closed
    after half the body its Content-Length announced)."""

    cuts = 1
    seen: list[str] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        cut = len(type(self).seen) <= type(self).cuts
        self.send_response(200)
        self.send_header("Content-Length", str(len(PACK)))
        self.end_headers()
        self.wfile.write(PACK[: len(PACK) // 2] if cut else PACK)
        if cut:
            self.wfile.flush()
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server():
    Cutting.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Cutting)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_pack_cut_short_is_fetched_again_whole(server, tmp_path):
    Cutting.cuts = 2
    fetcher = RemoteController(RunnerApi(server, "token")).fetcher(1, "snap", "lease", Event())
    dest = tmp_path / "pack-0"
    fetcher.pack(0, dest, 2 * len(PACK))
    assert dest.read_bytes() == PACK
    assert Cutting.seen == ["/api/runner/v1/snapshots/1/snap/pack-0"] * 3


def test_a_pack_that_stays_broken_fails_after_the_last_try(server, tmp_path):
    Cutting.cuts = 100
    fetcher = RemoteController(RunnerApi(server, "token")).fetcher(1, "snap", "lease", Event())
    dest = tmp_path / "pack-0"
    with pytest.raises(ServerUnavailable):
        fetcher.pack(0, dest, 2 * len(PACK))
    assert len(Cutting.seen) == 4
    assert not dest.exists()


def test_a_stopped_job_tries_no_download_again(server, tmp_path):
    """Its lease went, or the runner stops: what it would fetch is no use any more."""
    Cutting.cuts = 100
    stopped = Event()
    stopped.set()
    fetcher = RemoteController(RunnerApi(server, "token")).fetcher(1, "snap", "lease", stopped)
    with pytest.raises(ServerUnavailable):
        fetcher.pack(0, tmp_path / "pack-0", 2 * len(PACK))
    assert len(Cutting.seen) == 1
