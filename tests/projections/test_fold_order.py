"""A fold over several changelogs applies a key's records in the source's commit order, not in
the order of each stream's own positions: an order inserted after its customer moved city is
folded after the move, although the customers' stream is far ahead of the orders' in
positions; and its sources end every micro-batch at one source commit."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings, strategies as st

from lakefold.capture import CaptureConfig
from lakefold.projections import (
    Fold,
    ProjectionOptions,
    Runner,
    RunnerConfig,
    changelog,
    delta_table,
)
from lakefold.projections.definitions._api import Registry, registering_into
from lakefold.projections.operations import Catalog, SinkRoots
from lakefold.projections.operators._fold import _in_commit_order
from lakefold.spark._source_cuts import CutGroup
from lakefold.spark._source_formats import PositionStreamReader
from lakefold.spark._source_inputs import ChangelogSource
from lakefold.spark._source_positions import ReadOptions, offset, position_of
from lakefold.spark._source_records import InputQuery
from lakefold.store import ChangelogStore
from tests.capture.conftest import capture_now

pytestmark = pytest.mark.timeout(300)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=4),
                min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_records_of_several_streams_come_out_in_commit_order(
        transactions: list[list[str]], rng: random.Random) -> None:
    """Transactions touch two streams in any mix; each stream numbers its own records; the
    rows arrive shuffled: they come out as the source committed them."""
    committed, positions = [], {"a": 0, "b": 0}
    for t, sources in enumerate(transactions):
        for ordinal, source in enumerate(sources, start=1):
            positions[source] += 1
            committed.append({"_source": source, "_position": positions[source] * 7,
                              "_commit_lsn": 1000 + 16 * t, "_ordinal": ordinal, "_ts": None,
                              "_retry": None})
    shuffled = rng.sample(committed, len(committed))
    assert _in_commit_order(shuffled, "commit") == committed


def _registry() -> Registry:
    registry = Registry()
    with registering_into(registry):
        fold = Fold("ordered_from", key={"customers": "id", "orders": "customer_id"},
                    sources=[changelog("public.customers"), changelog("public.orders")],
                    schema="id bigint, city string, ordered_from string", key_column="id",
                    target=delta_table("upsert", keys=["id"]),
                    # a small record limit: batches end at many commits, never inside one
                    options=ProjectionOptions(max_records_per_batch=4))

        @fold.on("insert", "update", "truncate")
        def _change(state: dict[str, Any], record: Any) -> dict[str, Any]:
            if record.type == "truncate":
                return state
            if record.source == "customers":
                return {**state, "city": record.data["city"]}
            return {**state, "ordered_from": state.get("city")}  # where the order came from
    return registry


def test_a_fold_over_two_tables_sees_their_changes_in_commit_order(
        spark: Any, shop: CaptureConfig, tmp_path: Path) -> None:
    dsn = shop.source_dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(30):  # the customers' stream runs far ahead of the orders'
            conn.execute("UPDATE customers SET name = %s WHERE id = 2", (f"n{i}",))
        conn.execute("UPDATE customers SET city = 'Pune' WHERE id = 1")
        conn.execute("INSERT INTO orders VALUES (100, 1, 1, 10)")  # ordered from Pune
        with conn.transaction():  # one transaction: the move, then an order, then back
            conn.execute("UPDATE customers SET city = 'Rome' WHERE id = 3")
            conn.execute("INSERT INTO orders VALUES (101, 3, 1, 10)")
            conn.execute("UPDATE customers SET city = 'Oslo' WHERE id = 3")
    capture_now(shop)
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.1)
    with Runner(spark, _registry(), config) as runner, Catalog(dsn) as catalog:
        runner.run(until_caught_up=True, timeout=180)
        rows = DeltaTable(catalog.current("ordered_from").location("delta")) \
            .to_pyarrow_table().to_pylist()
    folded = {row["id"]: row for row in rows}
    assert (folded[1]["city"], folded[1]["ordered_from"]) == ("Pune", "Pune")
    assert (folded[3]["city"], folded[3]["ordered_from"]) == ("Oslo", "Rome")


def test_the_changelog_sources_of_a_fold_end_their_batches_at_one_source_commit(
        shop: CaptureConfig) -> None:
    """Spark asks each source in turn where its batch ends; a transaction the capture stores
    between the two questions goes to neither source's batch, then to both."""
    dsn = shop.source_dsn
    group = CutGroup.new("ordered_from", ("public.customers", "public.orders"))

    def reader(table: str, cuts: CutGroup | None) -> PositionStreamReader:
        query = InputQuery(dsn, ChangelogSource(table, table.split(".")[1]), cuts=cuts)
        return PositionStreamReader(query, ReadOptions(max_records_per_trigger=10_000),
                                    pa.schema([]))

    def end(source: PositionStreamReader, start: int) -> int:
        return position_of(source.latestOffset(
            {**source.query.offset_tag(), **offset(start)}, source.getDefaultReadLimit()))

    with ChangelogStore(dsn) as store:
        before = {t: store.head(t) for t in group.streams}
    customers, orders = reader("public.customers", group), reader("public.orders", group)
    uncut = reader("public.orders", None)
    assert end(customers, 0) == before["public.customers"] + 1  # round 0 asks customers first
    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("UPDATE customers SET city = 'Rome' WHERE id = 1")
        conn.execute("INSERT INTO orders VALUES (200, 1, 1, 10)")
    capture_now(shop)
    assert end(uncut, 0) == before["public.orders"] + 2  # without the cut: half of it
    assert end(orders, 0) == before["public.orders"] + 1  # the same round: none of it
    assert end(customers, 0) == before["public.customers"] + 2  # round 1: all of it
    assert end(orders, 0) == before["public.orders"] + 2


def test_the_record_limit_never_splits_a_transaction_between_batches(
        shop: CaptureConfig) -> None:
    """With a limit of 3 records per batch, transactions of two customer updates and an order
    each: every round's batches hold the same whole transactions in both streams, within the
    limit; a transaction of six updates alone passes the limit and is split at it, with all of
    its other stream's records in the same batch."""
    dsn = shop.source_dsn
    streams = ("public.customers", "public.orders")
    group = CutGroup.new("limited@1", streams)
    limit = 3

    def reader(table: str) -> PositionStreamReader:
        query = InputQuery(dsn, ChangelogSource(table, table.split(".")[1]), cuts=group)
        return PositionStreamReader(query, ReadOptions(max_records_per_trigger=limit),
                                    pa.schema([]))

    def lsns(stream: str, start: int, end: int) -> list[int]:
        with psycopg.connect(dsn) as conn:
            return [int(r[0]) for r in conn.execute(
                "SELECT c.commit_lsn FROM lakefold.changelog c JOIN "
                "lakefold.changelog_streams s USING (stream_id) WHERE s.name = %s "
                "AND c.position >= %s AND c.position < %s ORDER BY c.position",
                (stream, start, end))]

    with ChangelogStore(dsn) as store:
        starts = {t: store.head(t) + 1 for t in streams}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(8):
            with conn.transaction():
                conn.execute("UPDATE customers SET name = %s WHERE id IN (1, 2)", (f"n{i}",))
                conn.execute("INSERT INTO orders VALUES (%s, 1, 1, 1)", (300 + i,))
        with conn.transaction():
            conn.execute("UPDATE customers SET city = 'Rome'")
            conn.execute("INSERT INTO orders VALUES (400, 1, 1, 1)")
    capture_now(shop)
    with ChangelogStore(dsn) as store:
        heads = {t: store.head(t) for t in streams}
    readers = {t: reader(t) for t in streams}
    seen: list[set[int]] = []
    for _ in range(20):
        ends = {t: position_of(readers[t].latestOffset(
            {**readers[t].query.offset_tag(), **offset(starts[t])},
            readers[t].getDefaultReadLimit())) for t in streams}
        batch = {t: lsns(t, starts[t], ends[t]) for t in streams}
        if not any(batch.values()):
            break
        assert len(batch["public.customers"]) <= limit or len(set(
            batch["public.customers"])) == 1
        # the orders' transactions are the customers' ones, and no transaction is cut
        # except the big one, whose order comes with its first part
        assert set(batch["public.orders"]) <= set(batch["public.customers"])
        seen.append(set(batch["public.customers"]))
        starts = {t: ends[t] for t in streams}
    assert starts == {t: heads[t] + 1 for t in streams}
    big = max(seen[-1])
    assert [len(s) for s in seen][:4] == [1, 1, 1, 1]  # one two-update transaction a round
    assert sum(1 for s in seen if s == {big}) == 2  # six updates: split at the limit, 3 + 3
