"""The runner end to end on real PostgreSQL, the event store, Spark, Delta, Redis and
Tantivy: every target, dead letters, pause and resume."""

from __future__ import annotations

import random
import threading
import time
from decimal import Decimal
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
import redis
from deltalake import DeltaTable

from lakefold.local import LocalPostgres, LocalRedis
from lakefold.projections import (
    DeadLetters,
    ProjectionNotFoundError,
    ProjectionStateError,
    RedisCacheReader,
    Runner,
    RunnerConfig,
    SearchIndexReader,
    load_projections,
)
from lakefold.projections.operations import Catalog, SinkRoots, projection_status
from lakefold.projections.runtime._status import ProjectionStatus
from lakefold.projections.state._catalog import LOCK_NAMESPACE, generation_lock_key
from lakefold.projections.targets._search import IndexLayout, SearchIndexWriter
from tests.projections import helpers

pytestmark = pytest.mark.timeout(240)
EVENTS_MODULE = str(Path(__file__).with_name("event_projections.py"))


def test_event_projections_equal_a_fresh_computation(pg, spark, redis_url, tmp_path):
    rng = random.Random(7)
    expected_revenue = helpers.append_orders(pg.dsn, rng, 60, poison_every=13)
    registry = load_projections(EVENTS_MODULE)
    config = RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path),
                          redis_url=redis_url, poll_seconds=0.2)
    with Runner(spark, registry, config) as runner, Catalog(pg.dsn) as catalog:
        runner.run(until_caught_up=True, timeout=180)
        revenue = DeltaTable(catalog.current("revenue").location("delta")).to_pyarrow_table(
            ).to_pylist()
        assert {r["customer"]: r["revenue"] for r in revenue} == {
            k: v.quantize(Decimal("0.01")) for k, v in expected_revenue.items()}
        letters = DeadLetters(catalog).find("revenue")
        assert sorted(d.position for d in letters) == [13, 26, 39, 52]
        assert all("poison order" in d.error and d.attempts == 2 for d in letters)

        last, notes = helpers.orders_expected(pg.dsn)
        with RedisCacheReader(redis_url) as reader:
            assert sorted(reader.keys("last_order")) == sorted(last)
            for customer, row in last.items():
                assert reader.get("last_order", customer) == row

        search = SearchIndexReader(lambda view: catalog.current(view).location("search"))
        assert search.count("order_search") == len(notes)
        word = helpers.NOTE_WORDS[0]
        assert sorted(h.key for h in search.search("order_search", word, limit=100)) == sorted(
            order for order, note in notes.items() if word in note.split())

        # targeted rebuild: damage some keys, repair a key range and one stream in place
        client = redis.Redis.from_url(redis_url)
        prefix = catalog.current("last_order").location("redis")
        client.hset(prefix + "k:c1", "amount", "bogus")
        client.delete(prefix + "k:c2")
        client.hset(prefix + "k:c1x", "customer", "c1x")  # a stale key inside the range
        client.hset(prefix + "k:c5", "amount", "bogus")  # outside the range: left alone
        report = runner.rebuild_part("last_order", key_from="c1", key_to="c3")
        assert report.deleted == 1 and report.generation == 1
        with RedisCacheReader(redis_url) as reader:
            assert reader.get("last_order", "c1") == last["c1"]
            assert reader.get("last_order", "c2") == last["c2"]
            assert reader.get("last_order", "c1x") is None
            assert (reader.get("last_order", "c5") or {}).get("amount") == "bogus"
        client.close()
        damaged = sorted(notes)[3]
        index_writer = SearchIndexWriter(catalog.current("order_search").location("search"),
                                         IndexLayout(key="order", text=("note",), fields=()))
        index_writer.write(pa.Table.from_pylist([{"order": damaged, "_deleted": True}]),
                           batch_id=index_writer.checkpoint or 0, repair=True)
        index_writer.close()
        assert search.get("order_search", damaged) is None
        runner.rebuild_part("order_search", stream=damaged)
        assert (search.get("order_search", damaged) or {}).get("note") == notes[damaged]
        with pytest.raises(ProjectionStateError, match="is a fold"):
            runner.rebuild_part("revenue", key_from="c1")
        assert not catalog.projection("last_order").paused


def wait_until(predicate, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_pause_resume_and_dead_letter_retry(pg, spark, redis_url, tmp_path):
    rng = random.Random(5)
    antidote = tmp_path / "fixed"
    poisoned: dict[str, Decimal] = {}
    expected = helpers.append_orders(pg.dsn, rng, 30, poison_every=10, antidote=str(antidote),
                                     poisoned=poisoned)
    config = RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path),
                          redis_url=redis_url, poll_seconds=0.2,
                          only=("revenue", "last_order"))
    runner = Runner(spark, load_projections(EVENTS_MODULE), config)
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, kwargs={"stop": stop})
    thread.start()
    catalog = Catalog(pg.dsn)
    dead = DeadLetters(catalog)
    try:
        def revenue() -> dict[str, Decimal]:
            try:
                path = catalog.current("revenue").location("delta")
            except ProjectionNotFoundError:  # the runner has not installed the catalog yet
                return {}
            if not Path(path, "_delta_log").exists():
                return {}
            return {r["customer"]: r["revenue"]
                    for r in DeltaTable(path).to_pyarrow_table().to_pylist()}

        wait_until(lambda: revenue() == expected and len(dead.find("revenue")) == 3,
                   what="the first catch-up")
        # pause: the runner stops the query; new events do not reach the paused view
        catalog.set_paused("last_order", True)
        wait_until(lambda: not any(k[0] == "last_order" for k in runner.queries),
                   what="the pause")
        reader = RedisCacheReader(redis_url)
        frozen = {c: reader.get("last_order", c) for c in reader.keys("last_order")}
        more = helpers.append_orders(pg.dsn, rng, 10, first=30)
        for customer, amount in more.items():
            expected[customer] = expected.get(customer, Decimal(0)) + amount
        wait_until(lambda: revenue() == expected, what="the unpaused projection")
        assert {c: reader.get("last_order", c) for c in reader.keys("last_order")} == frozen
        assert catalog.projection("last_order").state == "paused"
        # the poison is fixed: retrying the dead letters folds them in, exactly once
        antidote.touch()
        dead.request_retry([d.id for d in dead.find("revenue")])
        for customer, amount in poisoned.items():
            expected[customer] = expected.get(customer, Decimal(0)) + amount
        wait_until(lambda: revenue() == expected, what="the retried dead letters")
        assert {d.status for d in dead.find("revenue")} == {"resolved"}
        # resume: the view catches up from where it stopped
        catalog.set_paused("last_order", False)
        last, _ = helpers.orders_expected(pg.dsn)
        wait_until(lambda: {c: reader.get("last_order", c) for c in last} == last,
                   what="the resumed projection")
        reader.close()
    finally:
        stop.set()
        thread.join()
        runner.close()
        catalog.close()


def _status(catalog: Catalog, dsn: str, name: str) -> ProjectionStatus | None:
    try:
        statuses = projection_status(catalog, dsn, [name])
    except ProjectionNotFoundError:  # the runner has not installed the catalog yet
        return None
    return statuses[0] if statuses else None


def _end_lock_session(dsn: str, name: str, generation: int) -> None:
    """End the session that holds a generation's lock (as a store restart would)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
            "AND objid = %s AND objsubid = 2 AND granted",
            (LOCK_NAMESPACE, generation_lock_key(name, generation))).fetchone()
        assert row is not None, "nothing holds the generation's lock"
        conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))


def test_a_projection_waiting_to_retry_is_retrying_not_stopped(pg, spark, tmp_path):
    """Its Redis down, a projection's query fails and waits for its retry with backoff: the
    runner keeps the generation's lock meanwhile, so status says ``retrying`` with the error
    (never ``stopped``), and ``running`` once Redis is back, also when the lock's session
    ended while it waited (the retry takes the lock again)."""
    server = LocalRedis().start()
    rng = random.Random(3)
    helpers.append_orders(pg.dsn, rng, 10)
    config = RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path),
                          redis_url=server.url, poll_seconds=0.2, only=("last_order",))
    runner = Runner(spark, load_projections(EVENTS_MODULE), config)
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, kwargs={"stop": stop})
    thread.start()
    catalog = Catalog(pg.dsn)
    try:
        def caught_up() -> bool:
            status = _status(catalog, pg.dsn, "last_order")
            return status is not None and status.state == "running" and \
                status.lag_records == 0
        wait_until(caught_up, what="the first catch-up")
        server.stop()
        helpers.append_orders(pg.dsn, rng, 5, first=10)
        seen: list[tuple[str, str | None]] = []
        deadline = time.monotonic() + 90
        # every state from the first failure through two backoffs (1 s, then 2 s)
        while sum(1 for state, _ in seen if state == "retrying") < 40:
            assert time.monotonic() < deadline, f"no retries seen: {seen[-5:]}"
            status = _status(catalog, pg.dsn, "last_order")
            assert status is not None
            seen.append((status.state, status.last_error))
            assert status.state in ("running", "retrying"), seen
            time.sleep(0.1)
        errors = {error for state, error in seen if state == "retrying"}
        assert errors and all(error and f"127.0.0.1:{server.port}" in error
                              for error in errors), errors
        _end_lock_session(pg.dsn, "last_order", 1)
        server = LocalRedis(port=server.port).start()
        wait_until(caught_up, what="the recovery")
        with RedisCacheReader(server.url) as reader:  # a new server: the orders since
            assert reader.keys("last_order")
    finally:
        stop.set()
        thread.join()
        runner.close()
        catalog.close()
        server.stop()


def test_a_run_outlives_a_restart_of_its_store(spark, tmp_path):
    """The store stops under a running `lakefold run` (a restart, a network cut): the run
    waits for it with backoff instead of ending, and once it is back the projection catches
    up with what was appended since, exactly once."""
    server = LocalPostgres(tmp_path / "pg", durable=False).start()
    dsn = server.dsn()
    rng = random.Random(11)
    expected = helpers.append_orders(dsn, rng, 12)
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.2,
                          only=("revenue",))
    runner = Runner(spark, load_projections(EVENTS_MODULE), config)
    stop = threading.Event()
    ended: list[BaseException] = []

    def run() -> None:
        try:
            runner.run(stop=stop)
        except BaseException as e:
            ended.append(e)
            raise

    thread = threading.Thread(target=run)
    thread.start()
    catalog = Catalog(dsn)

    def revenue() -> dict[str, Decimal] | None:
        try:
            location = catalog.current("revenue").location("delta")
            rows = DeltaTable(location).to_pyarrow_table().to_pylist()
        except Exception:  # not there yet, or the store is down
            return None
        return {r["customer"]: r["revenue"] for r in rows}

    def exact(values: dict[str, Decimal]) -> dict[str, Decimal]:
        return {k: v.quantize(Decimal("0.01")) for k, v in values.items()}

    try:
        wait_until(lambda: revenue() == exact(expected), what="the first catch-up")
        server.stop()
        time.sleep(4)  # a few looks of the runner fail meanwhile
        assert thread.is_alive() and not ended, ended
        server.start()
        more = helpers.append_orders(dsn, rng, 9, first=12)
        total = {k: expected.get(k, Decimal(0)) + more.get(k, Decimal(0))
                 for k in expected.keys() | more.keys()}
        wait_until(lambda: revenue() == exact(total), timeout=180,
                   what="the catch-up after the store came back")
        assert thread.is_alive() and not ended, ended
    finally:
        stop.set()
        thread.join()
        runner.close()
        catalog.close()
        server.stop()
