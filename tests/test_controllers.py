"""Two controllers on two hosts share one PostgreSQL database: each host a network namespace
made here, joined to a bridge of its own, PostgreSQL listening only on that bridge and on
loopback. Each controller has its own state directory and runs real `scheduler tick`
processes; the phase is a recording stand-in."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from aiworker.store.engine import Database
from aiworker.store.postgresql import WRITE_LOCK_KEY
from aiworker.store.schema import upgrade
from aiworker.store.task_records import create_task, ensure_repository
from tests import netns
from tests.helpers import run_process
from tests.pg_fixtures import PostgresServer, rows, start_server
from tests.test_scheduler import RECORDER, phase_runs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not netns.available(), reason="network namespaces need root and iproute2"),
]
HOSTS = ("host-a", "host-b")
TASKS = 21


class Controllers:
    """HOSTS as controllers in namespaces 1 and 2, against SERVER on the bridge."""

    def __init__(self, tmp_path: Path, server: PostgresServer, net: netns.Network, lease: int):
        self.tmp, self.server, self.net = tmp_path, server, net
        self.database = server.create_database()
        self.url = server.url(self.database, host=net.gateway)
        self.log = tmp_path / "phases.log"
        for host in HOSTS:
            config = tmp_path / f"{host}.toml"
            config.write_text(
                f'shares = 3\ncheck_interval = 10\n[database]\nurl = "{self.url}"\n'
                f'[controller]\nid = "{host}"\nlease = {lease}\n'
                "[scheduler.phase_commands]\n"
                f"implement = [{json.dumps(sys.executable)}, {json.dumps(str(RECORDER))}]\n"
            )

    def seed(self, count: int) -> None:
        db = Database(self.server.url(self.database))
        upgrade(db)
        with db.write() as session:
            repo = ensure_repository(session, 1, "team", "app")
            for number in range(1, count + 1):
                create_task(session, repo.id, "issue", issue_number=number)
        db.dispose()

    def tick(self, host: str, seconds: float = 1) -> subprocess.Popen[str]:
        n = HOSTS.index(host) + 1
        argv = [*self.net.prefix(n), sys.executable, "-m", "aiworker", "--json"]
        argv += ["--state-dir", str(self.tmp / host), "scheduler", "tick"]
        env = {
            **os.environ,
            "AIWORKER_CONFIG": str(self.tmp / f"{host}.toml"),
            "PHASE_LOG": str(self.log),
            "PHASE_SECONDS": str(seconds),
        }
        return subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def run_tick(self, host: str, seconds: float = 1) -> dict:
        proc = self.tick(host, seconds)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode in (0, 75), err  # 75: every slot of the host is busy
        report = json.loads(out)
        assert "recovered" in report, report
        return report

    def sql(self, query: str) -> list[tuple]:
        return rows(self.server.url(self.database), query)

    def claimed(self) -> Counter[int]:
        """How many task.claimed events each task has."""
        return Counter(
            t for (t,) in self.sql("select task_id from events where kind = 'task.claimed'")
        )


@pytest.fixture
def controllers(tmp_path, request):
    net = netns.Network(2)
    server = start_server(listen=f"127.0.0.1,{net.gateway}")
    made = Controllers(tmp_path, server, net, lease=getattr(request, "param", 300))
    try:
        yield made
    finally:
        for pid in phase_runs(made.log):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        server.stop("immediate")
        shutil.rmtree(server.folder, ignore_errors=True)
        net.close()


def peak(runs: list[dict]) -> int:
    edges = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_sixteen_ticks_on_two_hosts_claim_each_task_once(controllers):
    """Eight concurrent ticks on each host, 3 slots each, 21 tasks: no task is claimed
    twice, no host runs more than its 3 slots, and each claim names the host that
    started its job."""
    controllers.seed(TASKS)
    ticks = [(host, controllers.tick(host, seconds=10)) for host in HOSTS for _ in range(8)]
    started: dict[str, list[dict]] = {host: [] for host in HOSTS}
    for host, proc in ticks:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode in (0, 75), err
        if proc.returncode == 0:
            started[host] += json.loads(out)["started"]
    assert all(1 <= len(jobs) <= 3 for jobs in started.values()), started
    everything = [job for jobs in started.values() for job in jobs]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = phase_runs(controllers.log)
        if len(runs) >= len(everything) and all("end" in r for r in runs.values()):
            break
        time.sleep(0.2)
    for host, jobs in started.items():
        mine = [phase_runs(controllers.log)[job["pid"]] for job in jobs]
        assert peak(mine) <= 3, host
        assert len({r["slot"] for r in mine}) == len(mine)
    claimed = Counter(
        task
        for (task,) in controllers.sql("select task_id from events where kind = 'task.claimed'")
    )
    assert set(claimed.values()) == {1}
    assert sorted(claimed) == sorted(job["task"] for job in everything)
    holders = dict(controllers.sql("select id, claim_host from tasks where claim_host is not null"))
    assert holders == {job["task"]: host for host, jobs in started.items() for job in jobs}


@pytest.mark.parametrize("controllers", [12], indirect=True)
def test_a_silent_hosts_claims_are_recovered_after_its_lease_and_never_before(controllers):
    controllers.seed(6)
    first = controllers.run_tick("host-a", seconds=600)
    victims = {job["task"]: job["pid"] for job in first["started"]}
    assert len(victims) == 3
    # Host B cannot see host A's slot locks (they are on A's disk; B's own slots 1-3 are
    # free or B's): while A renews, past the lease, nothing of A's is touched.
    renewing = time.monotonic() + 15  # longer than the 12 s lease
    while time.monotonic() < renewing:
        controllers.run_tick("host-a")  # A is alive: its tick renews it
        report = controllers.run_tick("host-b", seconds=600)  # B's own jobs run on
        assert not {r["task"] for r in report["recovered"]} & set(victims), report
        time.sleep(2)
    # Host A goes away: its jobs die and its ticks stop. Its claims stay A's until the
    # lease runs out.
    for pid in victims.values():
        os.kill(pid, signal.SIGKILL)
    controllers.net.cut(1)
    silent_from = time.monotonic()
    while True:
        report = controllers.run_tick("host-b", seconds=600)
        recovered = {r["task"]: r for r in report["recovered"]}
        if recovered:
            break
        assert time.monotonic() - silent_from < 40, "host A's claims were never recovered"
        time.sleep(1)
    assert set(recovered) == set(victims)
    for item in recovered.values():
        assert item["state"] == "ready"  # B's slots are busy: they wait for the next claim
        assert item["reason"].startswith("controller host-a is gone (silent since")
    [(seen,)] = controllers.sql("select seen_at from controllers where id = 'host-a'")
    abandoned = controllers.sql(
        "select task_id, finished_at from attempts where outcome = 'abandoned'"
    )
    assert sorted(task for task, _ in abandoned) == sorted(victims)
    # Not before the lease: each was given up at least 12 s after A's last sign of life.
    assert all((finished - seen).total_seconds() >= 12 for _, finished in abandoned)
    held = dict(controllers.sql("select claim_host, count(*) from tasks group by claim_host"))
    assert held == {"host-b": 3, None: 3}


def test_a_database_restart_mid_tick_loses_and_doubles_nothing(controllers):
    """PostgreSQL restarts while eight ticks on two hosts are in the middle of their work
    (each waiting on the write lock, held here): each tick ends in a defined way (done, or
    unavailable with the reason), every task is claimed at most once, and both controllers
    carry on once it is back."""
    import psycopg

    controllers.seed(TASKS)
    blocker = psycopg.connect(controllers.server.url(controllers.database))
    blocker.execute(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")
    ticks = [(host, controllers.tick(host, seconds=600)) for host in HOSTS for _ in range(4)]
    waiting = "select count(*) from pg_stat_activity where wait_event = 'advisory'"
    deadline = time.monotonic() + 60
    while controllers.sql(waiting) != [(len(ticks),)]:
        assert time.monotonic() < deadline, "the ticks never reached the database"
        time.sleep(0.1)
    controllers.server.restart()
    blocker.close()  # its session ended with the restart
    for _, proc in ticks:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 75, (out, err)
        assert "PostgreSQL at" in json.loads(out)["error"]["message"]
    # Both carry on: each host's next tick claims for its free slots.
    for host in HOSTS:
        report = controllers.run_tick(host, seconds=600)
        assert len(report["started"]) == 3, report
    claimed = Counter(
        task
        for (task,) in controllers.sql("select task_id from events where kind = 'task.claimed'")
    )
    assert set(claimed.values()) == {1}
    held = controllers.sql("select id, claim_host from tasks where claim_slot is not null")
    assert sorted(task for task, _ in held) == sorted(claimed)
    assert Counter(host for _, host in held) == {"host-a": 3, "host-b": 3}
    assert controllers.sql("select count(*) from attempts") == [(0,)]  # nothing was spent


@pytest.mark.parametrize("controllers", [30], indirect=True)
def test_a_database_down_longer_than_the_lease_gives_no_live_host_up(controllers):
    """PostgreSQL is down longer than a controller's lease (an upgrade, its host
    rebooted): nobody could renew meanwhile, so host A, whose jobs ran on through it, is
    not taken for gone by host B the moment the server is back; `status` still shows A's
    last sign of life as it was recorded."""
    controllers.seed(6)
    victims = {job["task"] for job in controllers.run_tick("host-a", seconds=600)["started"]}
    assert len(victims) == 3
    assert controllers.run_tick("host-b", seconds=600)["recovered"] == []  # B watches A
    [(seen,)] = controllers.sql("select seen_at from controllers where id = 'host-a'")
    controllers.server.stop()
    time.sleep(35)  # longer than the 30 s lease
    controllers.server.start()
    report = controllers.run_tick("host-b", seconds=600)
    assert not {r["task"] for r in report["recovered"]} & victims, report
    shown = run_process(
        "--json", "--state-dir", str(controllers.tmp / "host-b"), "status",
        env={"AIWORKER_CONFIG": str(controllers.tmp / "host-b.toml")},
    )  # fmt: skip
    [a] = [c for c in shown.json()["controllers"] if c["id"] == "host-a"]
    assert datetime.fromisoformat(a["seen_at"]).replace(tzinfo=None) == seen  # as recorded
    controllers.run_tick("host-a")  # A renews, as its jobs' heartbeats would
    assert not {r["task"] for r in controllers.run_tick("host-b")["recovered"]} & victims


def test_a_tick_whose_network_goes_mid_query_ends_instead_of_waiting_for_ever(controllers):
    """Host A's network goes while its tick waits for the server's answer (here, for the
    write lock a session holds): no answer can ever arrive, and nothing is sent that
    could fail; the client's own keepalives find the connection dead, and the tick ends
    as unavailable instead of hanging until the kernel gives up, hours later."""
    import psycopg

    controllers.seed(3)
    blocker = psycopg.connect(controllers.server.url(controllers.database))
    try:
        blocker.execute(f"SELECT pg_advisory_xact_lock({WRITE_LOCK_KEY})")
        tick = controllers.tick("host-a")
        waiting = "select count(*) from pg_stat_activity where wait_event = 'advisory'"
        deadline = time.monotonic() + 60
        while controllers.sql(waiting) != [(1,)]:
            assert time.monotonic() < deadline, "the tick never reached the database"
            time.sleep(0.1)
        controllers.net.cut(1)
        out, err = tick.communicate(timeout=240)  # keepalives: dead within about a minute
    finally:
        blocker.close()
    assert tick.returncode == 75, (out, err)
    assert "PostgreSQL at" in json.loads(out)["error"]["message"]
