"""Worker jobs and their leases on a real SQLite file and a real PostgreSQL server: claims
are idempotent by request key, a lease is proof for heartbeat and finish, an expired lease
is claimed again with its attempt count raised, a finished job stays finished, and several
processes claiming at once each get distinct jobs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest

from aiworker.store.engine import Database
from aiworker.store.worker_jobs import (
    LeaseLost,
    anything_claimable,
    claim,
    enqueue,
    finish,
    heartbeat,
)
from tests.pg_fixtures import rows

LONG = timedelta(seconds=60)
# Long enough that the next statement runs within it even on two busy cores.
SHORT = timedelta(seconds=1)


@pytest.fixture
def db(store_url):
    database = Database(store_url)
    yield database
    database.dispose()


def take(db, worker="w1", key="k1", **options):
    options.setdefault("lease_for", LONG)
    options.setdefault("max_attempts", 3)
    return claim(db, worker, key, **options)


def test_jobs_are_keyed_by_repository_index_and_claimed_oldest_first(db):
    assert [enqueue(db, 1, {"n": n}) for n in range(2)] == [1, 2]
    assert enqueue(db, 2, {"n": 9}) == 1
    first = take(db, key="a")
    assert (first.repository_index, first.worker_job_index, first.attempt) == (1, 1, 1)
    only_two = take(db, key="b", repository_indexes=[2])
    assert (only_two.repository_index, only_two.request) == (2, {"n": 9})
    exact = take(db, key="c", exact=(1, 2))
    assert exact.worker_job_index == 2
    assert take(db, key="d") is None


def test_a_repeated_claim_after_a_lost_reply_gets_the_same_lease(db):
    enqueue(db, 1, {})
    enqueue(db, 1, {})
    first = take(db, key="lost-reply")
    again = take(db, key="lost-reply")
    assert again == first
    other = take(db, key="next")
    assert other.worker_job_index != first.worker_job_index
    # Another worker with the same key is not given someone else's lease.
    assert take(db, worker="w2", key="lost-reply") is None


def test_the_lease_is_proof_for_heartbeat_and_finish(db):
    enqueue(db, 1, {})
    lease = take(db)
    index = (1, 1)
    assert heartbeat(db, index, lease.token, LONG) > lease.expires_at - timedelta(seconds=1)
    with pytest.raises(LeaseLost):
        heartbeat(db, index, "forged", LONG)
    with pytest.raises(LeaseLost):
        finish(db, index, "forged", "succeeded", {"exit_code": 0})
    assert finish(db, index, lease.token, "succeeded", {"exit_code": 0}) == (
        "finished",
        {"exit_code": 0},
    )
    # A retried finish (its reply was lost) is answered with the stored outcome, for good.
    assert finish(db, index, lease.token, "failed", {"exit_code": 1}) == (
        "already finished",
        {"exit_code": 0},
    )
    with pytest.raises(LeaseLost):
        heartbeat(db, index, lease.token, LONG)
    assert rows(db.url, "select state from worker_jobs") == [("succeeded",)]


def test_an_expired_lease_holds_until_another_claim_takes_its_job(db):
    enqueue(db, 1, {})
    late = take(db, worker="late", lease_for=SHORT)
    assert take(db, worker="w2", key="k2") is None  # not while the lease holds
    time.sleep(1.2)
    # Past its expiry, with nobody having taken the job (as when the controller's clock
    # was set forward): its holder's heartbeat renews it. Before, the lease was lost
    # and the job ran again.
    heartbeat(db, (1, 1), late.token, SHORT)
    time.sleep(1.2)
    taken = take(db, worker="w2", key="k2")  # expired again: another claim takes it over
    assert (taken.worker_job_index, taken.attempt) == (1, 2)
    with pytest.raises(LeaseLost):
        heartbeat(db, (1, 1), late.token, LONG)
    with pytest.raises(LeaseLost):
        finish(db, (1, 1), late.token, "succeeded", {})
    assert finish(db, (1, 1), taken.token, "failed", {"exit_code": 3})[0] == "finished"


def test_a_result_that_came_after_the_expiry_is_accepted_while_nobody_took_the_job(db):
    enqueue(db, 1, {})
    late = take(db, worker="late", lease_for=SHORT)
    time.sleep(1.2)
    assert finish(db, (1, 1), late.token, "succeeded", {"exit_code": 0})[0] == "finished"
    assert rows(db.url, "select state, attempt_count from worker_jobs") == [("succeeded", 1)]


def test_an_exact_claim_ends_no_other_job_whose_lease_expired(db):
    """Two tasks' checks run on this host's embedded runner (one attempt each): the
    first's lease looks expired (the wall clock was set forward) while its holder still
    runs. The second's claim names its own job, and leaves the first to its holder."""
    enqueue(db, 1, {})
    first = take(db, worker="embedded-1", key="a", lease_for=SHORT, max_attempts=1, exact=(1, 1))
    time.sleep(1.2)
    enqueue(db, 1, {})
    assert take(db, worker="embedded-1", key="b", max_attempts=1, exact=(1, 2)) is not None
    heartbeat(db, (1, 1), first.token, LONG)  # before, "the lease expired on each of 1"
    assert rows(db.url, "select state from worker_jobs order by worker_job_index") == [
        ("leased",),
        ("leased",),
    ]


def test_a_job_whose_every_lease_expired_ends_failed(db):
    enqueue(db, 1, {})
    for attempt in (1, 2):
        lease = take(db, key=f"k{attempt}", lease_for=SHORT, max_attempts=2)
        assert lease.attempt == attempt
        time.sleep(1.2)
    assert take(db, key="k3", max_attempts=2) is None
    [(state, result)] = rows(db.url, "select state, result from worker_jobs")
    assert state == "failed"
    assert "the lease expired on each of 2 attempts" in str(result)  # JSON: text or a dict


def test_a_job_handed_back_on_each_of_its_attempts_ends_failed_and_frees_the_queue(db):
    """Runners hand a job back unrun (none has room for it, or each was stopped while
    claiming): it counts its attempts, and after the last one it ends failed with the
    reason instead of staying first in the queue for ever; the job behind it is taken."""
    from aiworker.store.worker_job_records import release

    first, second = enqueue(db, 1, {}), enqueue(db, 1, {})
    for attempt in (1, 2):
        lease = take(db, key=f"k{attempt}", max_attempts=2)
        assert (lease.worker_job_index, lease.attempt) == (first, attempt)
        assert release(db, (1, first), lease.token)
    assert anything_claimable(db, max_attempts=2)
    assert take(db, key="k3", max_attempts=2).worker_job_index == second
    [(state, result)] = rows(
        db.url, f"select state, result from worker_jobs where worker_job_index = {first}"
    )
    assert state == "failed"
    assert "handed back unrun on each of its 2 attempts" in str(result)  # JSON: text or a dict


WORKER = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    from aiworker.store.engine import Database
    from aiworker.store.worker_jobs import claim, finish

    db = Database(sys.argv[1])
    name = sys.argv[2]
    done = []
    number = 0
    while True:
        number += 1
        lease = claim(db, name, f"{name}-{number}", lease_for=timedelta(seconds=60),
                      max_attempts=3)
        if lease is None:
            break
        index = (lease.repository_index, lease.worker_job_index)
        assert finish(db, index, lease.token, "succeeded", {"by": name})[0] == "finished"
        done.append(f"{index[0]}/{index[1]}")
    db.dispose()
    print(" ".join(done))
    """
)


def test_several_processes_claim_distinct_jobs_each_exactly_once(db, store_url):
    for n in range(150):
        enqueue(db, 1 + n % 3, {"n": n})
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, store_url, f"runner-{w}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(4)
    ]
    done = []
    for worker in workers:
        out, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0
        done += out.split()
    assert len(done) == 150
    assert len(set(done)) == 150
    assert rows(
        store_url, "select count(*), min(attempt_count), max(attempt_count) from worker_jobs"
    ) == [(150, 1, 1)]
    assert rows(store_url, "select distinct state from worker_jobs") == [("succeeded",)]


def test_every_transition_of_a_job_is_an_event(db):
    from sqlalchemy import select

    from aiworker.store.tables import events
    from aiworker.store.worker_job_records import abandon, release

    first, second = enqueue(db, 1, {}), enqueue(db, 1, {})
    lease = take(db, key="a")
    assert release(db, (1, first), lease.token)
    lease = take(db, key="b")
    finish(db, (1, lease.worker_job_index), lease.token, "succeeded", {"ok": True})
    abandon(db, (1, second), {"error": "the operator gave up"})
    with db.read() as session:
        rows = session.execute(select(events).order_by(events.c.id)).all()
    assert [(r.kind, r.from_state, r.to_state, r.data["worker_job_index"]) for r in rows] == [
        ("worker_job.claimed", "queued", "leased", first),
        ("worker_job.released", "leased", "queued", first),
        ("worker_job.claimed", "queued", "leased", first),
        ("worker_job.finished", "leased", "succeeded", first),
        ("worker_job.abandoned", None, "failed", second),
    ]
    assert rows[0].actor == "w1"
