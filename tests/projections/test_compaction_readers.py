"""Compaction and the projections that read changelog streams: compaction never passes a
generation's committed position, a reader behind what compaction removed is told to rebuild,
and a history (SCD2) target gets the full history or refuses to rebuild, naming the compaction.

Oracles: the source table itself (SQL) for latest-state views, and for history views the SCD2
versions computed here from every record of the stream, read before any compaction."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from lakefold.capture import ChangelogStore
from lakefold.projections import RedisCacheReader, Runner, RunnerConfig, load_projections
from lakefold.projections.exceptions import ProjectionStateError
from lakefold.projections.operations import Catalog, SinkRoots
from lakefold.projections.runtime._status import projection_status
from lakefold.projections.state._readers import reader_name, release_gone
from tests.projections import helpers

pytestmark = pytest.mark.timeout(300)
MODULE = str(Path(__file__).with_name("compaction_projections.py"))
SCD2_COLUMNS = ("id", "price", "_position", "valid_from", "valid_to", "current")


def _config(pg: Any, redis_url: str, tmp_path: Path, *names: str) -> RunnerConfig:
    return RunnerConfig(store_dsn=pg.dsn, roots=SinkRoots.under(tmp_path), redis_url=redis_url,
                        poll_seconds=0.2, only=names)


def _all_records(dsn: str, stream: str) -> list[dict[str, Any]]:
    with ChangelogStore(dsn) as store:
        records: list[dict[str, Any]] = store.read(stream, 1, 1_000_000).to_pylist()
    return records


def _scd2_oracle(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The SCD2 versions of ``price`` per ``id`` that every record of a stream gives: a change
    of the price opens a version (closing the open one), a delete closes the open one."""
    versions: list[dict[str, Any]] = []
    open_by_key: dict[int, dict[str, Any]] = {}
    for record in sorted(records, key=lambda r: r["_position"]):
        key, ts = record["id"], record["_commit_ts"]
        current = open_by_key.get(key)
        if record["_op"] == "delete" or (current is not None and
                                         current["price"] == record["price"]):
            if record["_op"] == "delete" and current is not None:
                current.update(valid_to=ts, current=False)
                del open_by_key[key]
            continue
        if current is not None:
            current.update(valid_to=ts, current=False)
        version = {"id": key, "price": record["price"], "_position": record["_position"],
                   "valid_from": ts, "valid_to": None, "current": True}
        versions.append(version)
        open_by_key[key] = version
    return sorted(tuple(v[c] for c in SCD2_COLUMNS) for v in versions)


def _scd2_rows(path: str) -> list[tuple[Any, ...]]:
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    return sorted(tuple(r[c] for c in SCD2_COLUMNS) for r in rows)


def _redis_view(redis_url: str) -> dict[int, dict[str, Any] | None]:
    with RedisCacheReader(redis_url) as reader:
        return {int(k): reader.get("customer_cache", k) for k in reader.keys("customer_cache")}


def _change_everything(dsn: str, rng: random.Random, first: int) -> None:
    """Updates of most existing rows, deletes of some (rows the views already hold), new rows."""
    helpers.write_customers(dsn, rng, 40, start=first)
    helpers.write_products(dsn, rng, 30)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE customers SET city = city || '+' WHERE id % 2 = 0")
        conn.execute("DELETE FROM customers WHERE id % 5 = 0")
        conn.execute("UPDATE products SET price = price + 1 WHERE id % 2 = 1")
        conn.execute("DELETE FROM products WHERE id % 4 = 0")
    helpers.capture_now(dsn)


def _set_paused(catalog: Catalog, paused: bool, *names: str) -> None:
    for name in names:
        catalog.set_paused(name, paused)


def test_paused_projections_miss_no_update_or_delete_that_compaction_removed(
        pg, spark, redis_url, tmp_path):
    helpers.create_shop(pg.dsn)
    rng = random.Random(11)
    helpers.write_customers(pg.dsn, rng, 60)
    helpers.write_products(pg.dsn, rng, 40)
    helpers.capture_now(pg.dsn)
    names = ("customer_cache", "price_history")
    config = _config(pg, redis_url, tmp_path, *names)
    with Runner(spark, load_projections(MODULE), config) as runner, Catalog(pg.dsn) as catalog, \
            ChangelogStore(pg.dsn) as store:
        runner.run(until_caught_up=True, timeout=180)
        _set_paused(catalog, True, *names)
        runner.run(until_caught_up=True, timeout=60)  # notices the pause: queries stop

        _change_everything(pg.dsn, rng, 60)
        (paused,) = projection_status(catalog, pg.dsn, ["customer_cache"])
        assert paused.state == "paused" and list(paused.holds_compaction) == ["public.customers"]
        products_full = _all_records(pg.dsn, "public.products")
        store.compact(tombstone_retention=timedelta(0))  # every tombstone is past retention
        _set_paused(catalog, False, *names)
        runner.run(until_caught_up=True, timeout=180)
        assert _redis_view(redis_url) == helpers.customers(pg.dsn)
        history = _scd2_rows(catalog.current("price_history").location("delta"))
        assert history == _scd2_oracle(products_full)

        # price_history made its stream keep its full history; compaction was held for the
        # customers by the paused cache, which status names as what holds it
        products = store.compaction_state("public.products")
        assert products.keep_history and products.removed == 0
        assert "price_history" in (products.keep_history_reason or "")
        customers = store.compaction_state("public.customers")
        assert customers.held_by is not None
        assert customers.held_by.reader == reader_name("customer_cache", 1)

        # without kept history, the live history view is still protected by its position
        store.keep_history("public.products", False)
        _set_paused(catalog, True, *names)
        runner.run(until_caught_up=True, timeout=60)
        _change_everything(pg.dsn, rng, 100)
        products_full = _all_records(pg.dsn, "public.products")
        held = store.compaction_state("public.products")
        assert held.held_by is not None
        assert held.held_by.reader == reader_name("price_history", 1)
        store.compact(tombstone_retention=timedelta(0))
        after = store.compaction_state("public.products")
        assert 0 < after.compacted_to <= held.held_by.position  # compacted up to the hold
        assert after.removed > 0
        _set_paused(catalog, False, *names)
        runner.run(until_caught_up=True, timeout=180)
        assert _redis_view(redis_url) == helpers.customers(pg.dsn)
        history = _scd2_rows(catalog.current("price_history").location("delta"))
        assert history == _scd2_oracle(products_full)


def test_readers_behind_compaction_fail_with_the_fix_and_rebuild(pg, spark, redis_url,
                                                                  tmp_path):
    helpers.create_shop(pg.dsn)
    rng = random.Random(12)
    helpers.write_customers(pg.dsn, rng, 60)
    helpers.capture_now(pg.dsn)
    registry = load_projections(MODULE)
    with Runner(spark, registry, _config(pg, redis_url, tmp_path, "customer_cache")) as runner, \
            Catalog(pg.dsn) as catalog, ChangelogStore(pg.dsn) as store:
        runner.run(until_caught_up=True, timeout=180)
        catalog.set_paused("customer_cache", True)
        runner.run(until_caught_up=True, timeout=60)
        assert store.compaction_state("public.customers").held_by is not None
        position = catalog.current("customer_cache").position["customers"] - 1  # read up to
        # the reader's registration is lost: compaction passes it, tombstones expire
        assert store.release_reader(reader_name("customer_cache", 1)) == 1
        _change_everything(pg.dsn, rng, 60)
        store.compact("public.customers", tombstone_retention=timedelta(0))
        state = store.compaction_state("public.customers")
        assert state.expired_to > position
        catalog.set_paused("customer_cache", False)
        runner.run(until_caught_up=True, timeout=120)
        row = catalog.projection("customer_cache")
        assert row.state == "failed"
        error = row.last_error or ""
        for part in ("public.customers", f"position {state.expired_to}",
                     "lakefold rebuild customer_cache"):
            assert part in error, (part, error)
        # where it resumes reading: the catalog's position, or the batch before it when the
        # pause stopped Spark's query between the sink's commit and its own commit log
        read = re.search(r"has read public\.customers up to position (\d+)", error)
        assert read is not None and 0 < int(read[1]) <= position, error
        # the fix the error names: a rebuild from the compacted stream is the table
        runner.request_rebuild("customer_cache")
        runner.run(until_caught_up=True, timeout=180)
        assert catalog.current("customer_cache").generation == 2
        assert _redis_view(redis_url) == helpers.customers(pg.dsn)
        # generation 1 is retired: only generation 2 holds the stream's compaction now
        holders = {h.reader for h in store.compaction_state("public.customers").readers}
        assert holders == {reader_name("customer_cache", 2)}

    # a history view created after compaction removed records would start inside them
    history = ("customer_history",)
    with Runner(spark, registry, _config(pg, redis_url, tmp_path, *history)) as runner, \
            Catalog(pg.dsn) as catalog:
        runner.run(until_caught_up=True, timeout=120)
        row = catalog.projection("customer_history")
        assert row.state == "failed"
        error = row.last_error or ""
        for part in ("customer_history", "public.customers", "compaction", "scd2",
                     f"position {state.removed_to}"):
            assert part in error, (part, error)
        assert not Path(catalog.current("customer_history").location("delta")).exists()


def test_a_history_rebuild_gets_the_kept_history_or_refuses(pg, spark, redis_url, tmp_path):
    helpers.create_shop(pg.dsn)
    rng = random.Random(13)
    helpers.write_products(pg.dsn, rng, 60)
    helpers.capture_now(pg.dsn)
    config = _config(pg, redis_url, tmp_path, "price_history")
    with Runner(spark, load_projections(MODULE), config) as runner, \
            Catalog(pg.dsn) as catalog, ChangelogStore(pg.dsn) as store:
        runner.run(until_caught_up=True, timeout=180)
        _change_everything(pg.dsn, rng, 60)
        runner.run(until_caught_up=True, timeout=120)
        _change_everything(pg.dsn, rng, 100)
        runner.run(until_caught_up=True, timeout=120)
        store.compact(tombstone_retention=timedelta(0))  # the stream keeps its history
        full = _all_records(pg.dsn, "public.products")
        live = _scd2_rows(catalog.current("price_history").location("delta"))
        assert live == _scd2_oracle(full)
        runner.request_rebuild("price_history")
        runner.run(until_caught_up=True, timeout=180)
        assert catalog.current("price_history").generation == 2
        assert _scd2_rows(catalog.current("price_history").location("delta")) == live

        # history no longer kept: compaction removes what the live generation has passed,
        # and a rebuild, which could not be the history the live run built, is refused
        store.keep_history("public.products", False)
        _change_everything(pg.dsn, rng, 140)
        runner.run(until_caught_up=True, timeout=120)
        _change_everything(pg.dsn, rng, 180)
        runner.run(until_caught_up=True, timeout=120)
        full = _all_records(pg.dsn, "public.products")
        store.compact(tombstone_retention=timedelta(0))
        state = store.compaction_state("public.products")
        assert state.removed > 0 and state.last_run is not None
        with pytest.raises(ProjectionStateError) as refused:
            runner.request_rebuild("price_history")
        message = str(refused.value)
        for part in ("price_history", "public.products", "scd2", "compaction",
                     f"position {state.removed_to}", state.last_run.strftime("%Y-%m-%d")):
            assert part in message, (part, message)
        assert catalog.building("price_history") is None
        # the live generation is untouched and still exact
        _change_everything(pg.dsn, rng, 220)
        full += [r for r in _all_records(pg.dsn, "public.products")
                 if r["_position"] > full[-1]["_position"]]
        runner.run(until_caught_up=True, timeout=120)
        assert _scd2_rows(catalog.current("price_history").location("delta")) == _scd2_oracle(full)


def test_generations_that_no_longer_run_stop_holding_compaction(pg, tmp_path):
    helpers.create_shop(pg.dsn)
    helpers.write_customers(pg.dsn, random.Random(14), 30)
    helpers.capture_now(pg.dsn)
    stream = "public.customers"
    with Catalog(pg.dsn, SinkRoots.under(tmp_path)) as catalog, \
            ChangelogStore(pg.dsn) as store:
        catalog.install()
        for name in ("v", "w"):
            catalog.ensure(name, target_kind="redis", fingerprint="f", keep_generations=1)
        catalog.begin_rebuild("v")
        readers = [reader_name("v", 1), reader_name("v", 2), reader_name("w", 1),
                   reader_name("gone", 1)]
        for position, reader in enumerate(readers):
            store.commit_reader(reader, stream, position + 1)
        store.commit_reader("my-subscription", stream, 20)

        def holders() -> set[str]:
            return {r.reader for r in store.readers(stream)}

        assert release_gone(pg.dsn, catalog) == [reader_name("gone", 1)]  # not in the catalog
        catalog.abandon("v", 2)
        assert release_gone(pg.dsn, catalog) == [reader_name("v", 2)]
        catalog.begin_rebuild("v")
        catalog.switch("v", 3)  # generation 1 is retired (kept, but never read again)
        assert release_gone(pg.dsn, catalog) == [reader_name("v", 1)]
        catalog.forget("w")
        assert release_gone(pg.dsn, catalog) == [reader_name("w", 1)]
        assert holders() == {"my-subscription"}  # not a projection's: left alone
        store.compact(stream, tombstone_retention=timedelta(0))
        state = store.compaction_state(stream)
        assert state.held_by is not None and state.held_by.reader == "my-subscription"
        assert state.compacted_to == 20


KILLED = ("customer_cache", "price_history")


def _batch_ids(catalog: Catalog) -> tuple[int, ...]:
    return helpers.committed_batches(catalog, KILLED)


class _Oracle:
    """A durable history reader of its own: it keeps every record of a stream, reading them
    before compaction may remove them (it is always ahead of the projections)."""

    def __init__(self, store: ChangelogStore, stream: str) -> None:
        self.store, self.stream = store, stream
        self.records: list[dict[str, Any]] = []
        self.position = 0
        store.commit_reader("oracle", stream, 0, history=True)

    def catch_up(self) -> None:
        head = self.store.head(self.stream)
        self.records += [r for r in self.store.read(self.stream, self.position + 1,
                                                    1_000_000).to_pylist()
                         if r["_position"] <= head]
        self.position = head
        self.store.commit_reader("oracle", self.stream, head, history=True)


@pytest.mark.timeout(600)
def test_sigkill_while_compaction_runs_leaves_every_view_exact(pg, redis_url, tmp_path):
    """A runner killed at random moments while the streams it reads are compacted (retention
    0, so every tombstone it has not read would go) ends with views equal to the source."""
    helpers.create_shop(pg.dsn)
    rng = random.Random(21)
    helpers.write_customers(pg.dsn, rng, 40)
    helpers.write_products(pg.dsn, rng, 40)
    helpers.capture_now(pg.dsn)

    def start(mode: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.projections.kill_child", "compaction_projections.py",
             pg.dsn, redis_url, str(tmp_path), mode, "customer_cache", "price_history"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)

    with ChangelogStore(pg.dsn) as store, Catalog(pg.dsn) as catalog:
        store.keep_history("public.products", False)  # a live history view over a compacted
        oracle = _Oracle(store, "public.products")  # stream: its position protects it

        def compact() -> None:
            oracle.catch_up()
            store.compact(tombstone_retention=timedelta(0), chunk_positions=17)

        busy = 0
        for kill in range(2):
            before = _batch_ids(catalog)
            child = start("run")

            for round_ in range(2):
                # The first runner commits the initial rows (and so registers its readers)
                # before anything is compacted; later ones get changes first, so that they
                # have something to commit even when their predecessor had processed it all.
                if round_ == 0 and kill == 0:
                    helpers.wait_for_commits(catalog, KILLED, before, timeout=120)
                _change_everything(pg.dsn, rng, 60 + 40 * (2 * kill + round_))
                compact()
                if round_ == 0 and kill > 0:
                    helpers.wait_for_commits(catalog, KILLED, before, timeout=120)
                time.sleep(rng.uniform(0.0, 0.6))
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            assert child.stdout is not None
            child.stdout.close()
            busy += _batch_ids(catalog) != before
            compact()  # right after the kill: only what the dead runner committed may go
        assert busy >= 1, "the runner never committed a batch: the kills proved nothing"
        child = start("finish")
        out, _ = child.communicate(timeout=300)
        assert child.returncode == 0 and b"caught up" in out
        compact()
        assert store.compaction_state("public.customers").expired_to > 0
        assert store.compaction_state("public.products").removed > 0
        assert _redis_view(redis_url) == helpers.customers(pg.dsn)
        history = _scd2_rows(catalog.current("price_history").location("delta"))
        assert history == _scd2_oracle(oracle.records)
