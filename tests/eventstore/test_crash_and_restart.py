"""Crash safety: a consumer killed with SIGKILL at random moments, whose writes and checkpoint
commit together, applies every event exactly once; subscriptions ride out a server restart."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from lakefold.eventstore import (
    EventStore,
    EventStoreUnavailableError,
    StoreOptions,
    SubscriptionOptions,
)
from lakefold.local import LocalPostgres
from lakefold.schemas import NewEvent
from tests.fixtures.postgres import TestDatabase

# The consumer: for each batch, insert one row per event and move the checkpoint, in one
# transaction. A duplicate delivery after a crash would violate the primary key and stop it.
CONSUMER = """
import sys
import time
from lakefold.eventstore import EventStore, SubscriptionOptions
dsn, total = sys.argv[1], int(sys.argv[2])
with EventStore(dsn) as store:
    if (store.load_checkpoint("applier") or 0) >= total:
        sys.exit(0)
with EventStore(dsn) as store, store.subscribe(
        "applier", SubscriptionOptions(batch_size=50, poll_interval_s=0.2)) as sub:
    for batch in sub:
        with store.transaction() as tx:
            with tx.connection.cursor() as cur:
                cur.executemany("INSERT INTO applied (event_id, position) VALUES (%s, %s)",
                                [(e.event_id, e.position) for e in batch.events])
            tx.save_checkpoint("applier", batch.last_position)
        time.sleep(0.03)  # some work between batches
        if batch.last_position >= total:
            break
"""

TOTAL = 2000


def _applied(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM applied").fetchone()
    return int(row[0]) if row else 0


def _start(dsn: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as err:
        return subprocess.Popen([sys.executable, "-c", CONSUMER, dsn, str(TOTAL)], stderr=err)


@pytest.mark.timeout(180)
def test_sigkilled_consumer_applies_every_event_exactly_once(pg: TestDatabase,
                                                             tmp_path: Path) -> None:
    log = tmp_path / "consumer.log"
    with EventStore(pg.dsn) as store:
        store.install()
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE applied (event_id uuid PRIMARY KEY, position bigint)")

        def produce() -> None:
            for i in range(0, TOTAL, 100):
                store.append(f"order-{i // 100}", [NewEvent("order.placed", {"i": i + j})
                                                   for j in range(100)])
                time.sleep(0.15)

        producer = threading.Thread(target=produce)
        producer.start()
        rng = random.Random(7)
        kills = 0
        applied_at_kill: list[int] = []
        consumer = _start(pg.dsn, log)
        try:
            while kills < 3:
                # kill a consumer that is working: after it applied something, at a random
                # moment of its next batches
                deadline = time.monotonic() + 30
                if applied_at_kill and applied_at_kill[-1] >= TOTAL:
                    break
                while _applied(pg.dsn) <= (applied_at_kill[-1] if applied_at_kill else 0):
                    assert time.monotonic() < deadline, (applied_at_kill, log.read_text())
                    assert consumer.poll() is None, log.read_text()
                    time.sleep(0.02)
                time.sleep(rng.uniform(0, 0.3))
                if consumer.poll() is not None:
                    break
                consumer.send_signal(signal.SIGKILL)
                applied_at_kill.append(_applied(pg.dsn))
                consumer.wait()
                kills += 1
                consumer = _start(pg.dsn, log)
            producer.join()
            try:
                consumer.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with psycopg.connect(pg.dsn) as conn:
                    diag = {
                        "activity": conn.execute(
                            "SELECT pid, state, backend_xid, xact_start, left(query, 60), "
                            "wait_event_type, wait_event FROM pg_stat_activity "
                            "WHERE backend_type = 'client backend'").fetchall(),
                        "sequencer": conn.execute(
                            "SELECT * FROM lakefold.event_sequencer").fetchall(),
                        "events": conn.execute(
                            "SELECT count(*) FROM lakefold.events").fetchall(),
                        "checkpoint": conn.execute(
                            "SELECT * FROM lakefold.subscription_checkpoints").fetchall(),
                        "applied": _applied(pg.dsn),
                        "locks": conn.execute(
                            "SELECT locktype, objid, pid, granted FROM pg_locks "
                            "WHERE locktype = 'advisory'").fetchall(),
                    }
                raise AssertionError(repr(diag)) from None
        finally:
            consumer.kill()
            consumer.wait()
            producer.join()
        assert consumer.returncode == 0, log.read_text()
        # the kills hit a consumer in the middle of its work, not before or after it
        assert sum(0 < n < TOTAL for n in applied_at_kill) >= 3, applied_at_kill
        with psycopg.connect(pg.dsn) as conn:
            positions = [r[0] for r in conn.execute(
                "SELECT position FROM applied ORDER BY position").fetchall()]
        assert positions == list(range(1, TOTAL + 1))
        assert store.load_checkpoint("applier") == TOTAL


@pytest.mark.timeout(120)
def test_subscription_and_sequencer_ride_out_a_server_restart() -> None:
    with LocalPostgres(durable=False) as server:
        server.start()
        options = StoreOptions(watermark_threshold_s=1.0)
        with EventStore(server.dsn(), options=options) as store:
            store.install()
            store.append("order-1", [NewEvent("order.placed", {"n": 0})])
            received: list[int] = []
            subscription = store.subscribe("restart", SubscriptionOptions(
                poll_interval_s=0.2, retry_interval_s=0.2))

            def consume() -> None:
                for event in subscription.events():
                    received.append(event.data["n"])

            thread = threading.Thread(target=consume)
            thread.start()
            deadline = time.monotonic() + 30
            while received != [0]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            server.restart()
            for n in (1, 2):
                for _ in range(50):  # the first use of each pooled connection finds it dead
                    try:
                        store.append("order-1", [NewEvent("order.placed", {"n": n})])
                        break
                    except EventStoreUnavailableError:
                        time.sleep(0.1)
            while received != [0, 1, 2]:
                assert time.monotonic() < deadline, received
                time.sleep(0.05)
            subscription.stop()
            thread.join(10)
            subscription.close()
        assert received == [0, 1, 2]
