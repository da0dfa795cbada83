"""The global order under load: 32 writers with random delays and rollbacks append 200,000
events while 4 subscribers follow the log live. Every subscriber must receive every committed
event exactly once, in cursor order, and no rolled-back event."""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest

from lakefold.eventstore import (
    EventStore,
    StoreOptions,
    StreamEvents,
    SubscriptionOptions,
)
from lakefold.schemas import NewEvent
from tests.fixtures.postgres import TestDatabase

TOTAL = 200_000
WRITERS = 32
SUBSCRIBERS = 4


class _Rollback(Exception):
    """Raised inside a transaction to roll it back on purpose."""


@dataclass
class _Writer:
    index: int
    quota: int
    committed: list[uuid.UUID] = field(default_factory=list)
    rolled_back: list[uuid.UUID] = field(default_factory=list)
    error: BaseException | None = None

    def run(self, store: EventStore) -> None:
        try:
            self._run(store)
        except BaseException as e:  # reported by the test
            self.error = e

    def _run(self, store: EventStore) -> None:
        rng = random.Random(self.index)
        streams = [f"{rng.choice(['order', 'cart', 'acct'])}-{self.index}-{n}" for n in range(8)]
        remaining = self.quota
        while remaining:
            time.sleep(rng.uniform(0, 0.005))
            roll = rng.random()
            if roll < 0.15 or remaining < 5:  # a single-event append, autocommit
                event = NewEvent("single", {"w": self.index})
                store.append(rng.choice(streams), [event])
                self.committed.append(event.event_id)
                remaining -= 1
                continue
            size = min(remaining, rng.randint(50, 500))
            events = [NewEvent("batched", {"w": self.index, "i": i}) for i in range(size)]
            split = rng.randint(1, size - 1) if roll < 0.35 else size
            parts = [StreamEvents(s, chunk) for s, chunk in zip(
                rng.sample(streams, 2), (events[:split], events[split:]), strict=False) if chunk]
            rollback = rng.random() < 0.12
            try:
                with store.transaction() as tx:
                    tx.append_streams(parts)
                    time.sleep(rng.uniform(0, 0.03))  # commit late: others overtake us
                    if rollback:
                        raise _Rollback
            except _Rollback:
                self.rolled_back.extend(e.event_id for e in events)
                continue
            self.committed.extend(e.event_id for e in events)
            remaining -= size


@dataclass
class _Subscriber:
    name: str
    batch_size: int
    received: list[tuple[int, uuid.UUID, str, int]] = field(default_factory=list)
    first_at: float | None = None
    error: BaseException | None = None

    def run(self, store: EventStore, stop: threading.Event) -> None:
        try:
            options = SubscriptionOptions(batch_size=self.batch_size, poll_interval_s=0.5)
            with store.subscribe(self.name, options) as subscription:
                def stopper() -> None:
                    stop.wait()
                    subscription.stop()

                threading.Thread(target=stopper, daemon=True).start()
                for batch in subscription:
                    if self.first_at is None:
                        self.first_at = time.monotonic()
                    self.received.extend(
                        (e.position or 0, e.event_id, e.stream_id, e.stream_version)
                        for e in batch.events)
                    subscription.save_checkpoint(batch.last_position)
        except BaseException as e:
            self.error = e


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_32_writers_and_4_subscribers_agree_on_one_gap_free_order(pg: TestDatabase) -> None:
    options = StoreOptions(pool_size=WRITERS + SUBSCRIBERS + 4, sequence_interval_s=0.005)
    with EventStore(pg.dsn, options=options) as store:
        store.install()
        writers = [_Writer(i, TOTAL // WRITERS + (i < TOTAL % WRITERS)) for i in range(WRITERS)]
        subscribers = [_Subscriber(f"sub-{i}", size)
                       for i, size in enumerate((500, 1000, 2000, 5000))]
        stop = threading.Event()
        sub_threads = [threading.Thread(target=s.run, args=(store, stop)) for s in subscribers]
        for thread in sub_threads:
            thread.start()
        started = time.monotonic()
        writer_threads = [threading.Thread(target=w.run, args=(store,)) for w in writers]
        for thread in writer_threads:
            thread.start()
        for thread in writer_threads:
            thread.join()
        writers_done = time.monotonic()
        assert [w.error for w in writers] == [None] * WRITERS
        committed = {i for w in writers for i in w.committed}
        rolled_back = {i for w in writers for i in w.rolled_back}
        assert len(committed) == TOTAL and rolled_back and not committed & rolled_back

        deadline = time.monotonic() + 120
        while any(len(s.received) < TOTAL and s.error is None for s in subscribers):
            assert time.monotonic() < deadline, [len(s.received) for s in subscribers]
            time.sleep(0.05)
        stop.set()
        for thread in sub_threads:
            thread.join(30)
        assert store.head() == TOTAL

    for sub in subscribers:
        assert sub.error is None, sub.error
        positions = [r[0] for r in sub.received]
        assert positions == list(range(1, TOTAL + 1)), sub.name  # dense, in order, once each
        ids = [r[1] for r in sub.received]
        assert set(ids) == committed and len(ids) == TOTAL
        assert sub.first_at is not None and sub.first_at < writers_done  # it followed live
    reference = subscribers[0].received
    assert all(s.received == reference for s in subscribers[1:])  # one order for everyone
    versions: dict[str, int] = {}
    for _, _, stream_id, version in reference:  # per stream: versions 1, 2, 3... in order
        assert version == versions.get(stream_id, 0) + 1, stream_id
        versions[stream_id] = version
    print(f"\n{TOTAL} events by {WRITERS} writers in {writers_done - started:.1f} s; "
          f"{len(rolled_back)} rolled back")
