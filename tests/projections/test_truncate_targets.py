"""A truncate in each target, writer by writer (issue 18, item 5): what it removes, what stays,
and that a replayed batch holding a truncate changes nothing. The property tests run random
changelogs (inserts, updates, deletes, truncates) cut into random micro-batches through the
source's ``cut`` mode and the Redis and Delta upsert writers, against replaying the changelog
itself."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings, strategies as st

from lakefold.projections.definitions._target_specs import delta_table
from lakefold.projections.targets._delta import DeltaViewWriter
from lakefold.projections.targets._redis import RedisCacheReader, RedisCacheWriter
from lakefold.projections.targets._search import IndexLayout, SearchIndexReader, SearchIndexWriter
from lakefold.spark._source_truncates import Truncate, apply_mode, cut_records, fan_out

pytestmark = pytest.mark.timeout(240)


def t(day: int) -> dt.datetime:
    return dt.datetime(2024, 1, day, tzinfo=dt.UTC)


# --------------------------------------------------------------------------- Delta upsert


def upserts(*items: tuple[int, str | None, int, bool]) -> pa.Table:
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("_position", pa.int64()),
                        ("_deleted", pa.bool_())])
    return pa.Table.from_pylist([{"id": i, "v": v, "_position": p, "_deleted": d}
                                 for i, v, p, d in items], schema=schema)


def delta_rows(path: str) -> dict[int, str]:
    return {r["id"]: r["v"] for r in DeltaTable(path).to_pyarrow_table().to_pylist()}


def test_delta_upsert_replaces_the_table_on_a_truncate(tmp_path):
    path = str(tmp_path / "v")
    writer = DeltaViewWriter(delta_table("upsert", keys=["id"]), path, app_id="v@1", name="v")
    writer.write_arrow(upserts((1, "a", 1, False), (2, "b", 2, False), (3, "c", 3, False)), 0)
    # truncate at 10; the source hands over only what follows it (11, 12, 13)
    after = upserts((2, "B", 11, False), (4, "d", 12, False), (4, None, 13, True),
                    (5, "e", 13, False))
    writer.write_arrow(after, 1, replace=True)
    assert delta_rows(path) == {2: "B", 5: "e"}
    assert writer.write_arrow(upserts((9, "z", 14, False)), 1, replace=True).skipped
    assert delta_rows(path) == {2: "B", 5: "e"}
    writer.write_arrow(upserts(), 2, replace=True)  # a truncate with nothing after it
    assert delta_rows(path) == {}
    assert DeltaTable(path).transaction_version("v@1") == 2
    writer.write_arrow(upserts((7, "g", 20, False)), 3)
    assert delta_rows(path) == {7: "g"}


def test_delta_upsert_truncate_through_the_spark_sink(spark, tmp_path):
    path = str(tmp_path / "v")
    writer = DeltaViewWriter(delta_table("upsert", keys=["id"]), path, app_id="v@1", name="v")
    schema = "id long, v string, _position long, _deleted boolean"
    writer.write(spark.createDataFrame([(1, "a", 1, False), (2, "b", 2, False)], schema), 0)
    truncated = [Truncate(position=3, at=t(2))]
    batch = spark.createDataFrame([(2, "B", 4, False), (3, "c", 5, False), (3, "C", 6, False)],
                                  schema)
    writer.write(batch, 1, truncates=truncated)
    assert delta_rows(path) == {2: "B", 3: "C"}
    assert writer.write(batch, 1, truncates=truncated).skipped
    writer.write(spark.createDataFrame([], schema), 2, truncates=[Truncate(7, t(3))])
    assert delta_rows(path) == {}


# --------------------------------------------------------------------------- Delta SCD2

SCD2 = pa.schema([("id", pa.int64()), ("price", pa.decimal128(10, 2)),
                  ("_ts", pa.timestamp("us", tz="UTC")), ("_position", pa.int64()),
                  ("_deleted", pa.bool_())])


def changes(*items: tuple[int, str | None, int, int, bool]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"id": i, "price": Decimal(p) if p else None, "_ts": t(d), "_position": pos,
          "_deleted": deleted} for i, p, d, pos, deleted in items], schema=SCD2)


def history(path: str) -> list[tuple[object, ...]]:
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    return sorted((r["id"], str(r["price"]), r["valid_from"].day,
                   r["valid_to"].day if r["valid_to"] else None, r["current"]) for r in rows)


def test_scd2_truncate_closes_every_open_version(tmp_path):
    path = str(tmp_path / "prices")
    writer = DeltaViewWriter(delta_table("scd2", keys=["id"]), path, app_id="p@1", name="p")
    writer.write_scd2(changes((1, "10.00", 1, 1, False), (2, "5.00", 1, 2, False)), 0)
    # batch 1: 1 changes (day 2), 3 appears (day 2), the table is truncated (day 3), then 2
    # comes back (day 4): versions open at the truncate close then, those after it open
    batch = changes((1, "11.00", 2, 3, False), (3, "7.00", 2, 4, False),
                    (2, "6.00", 4, 6, False))
    writer.write_scd2(batch, 1, truncates=[Truncate(position=5, at=t(3))])
    expected = [
        (1, "10.00", 1, 2, False), (1, "11.00", 2, 3, False),
        (2, "5.00", 1, 3, False), (2, "6.00", 4, None, True),
        (3, "7.00", 2, 3, False),
    ]
    assert history(path) == expected
    assert writer.write_scd2(batch, 1, truncates=[Truncate(position=5, at=t(3))]).skipped
    # a truncate with nothing after it, then a new version: the table is history only
    writer.write_scd2(changes(), 2, truncates=[Truncate(position=7, at=t(5))])
    writer.write_scd2(changes((2, "6.00", 6, 8, False)), 3)
    assert history(path) == [*expected[:3], (2, "6.00", 4, 5, False),
                             (2, "6.00", 6, None, True), expected[4]]


def test_scd2_truncate_in_the_first_batch(tmp_path):
    path = str(tmp_path / "prices")
    writer = DeltaViewWriter(delta_table("scd2", keys=["id"]), path, app_id="p@1", name="p")
    writer.write_scd2(changes((1, "1.00", 1, 1, False), (2, "2.00", 3, 3, False)), 0,
                      truncates=[Truncate(position=2, at=t(2))])
    assert history(path) == [(1, "1.00", 1, 2, False), (2, "2.00", 3, None, True)]


# --------------------------------------------------------------------------- Redis


def redis_rows(*items: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(items))


def test_redis_truncate_deletes_what_came_before_and_replays_change_nothing(redis_url):
    prefix = f"lf:c{uuid.uuid4().hex[:6]}:g1:"
    writer = RedisCacheWriter(redis_url, prefix, key="id")
    writer.write(redis_rows({"id": 1, "v": "a"}, {"id": 2, "v": "b"}), batch_id=0, position=5)
    writer.write(redis_rows({"id": 3, "v": "c", "_position": 6}), batch_id=1, position=7)
    truncated = redis_rows({"id": 2, "v": "B", "_position": 9})
    writer.write(truncated, batch_id=2, position=10, truncated_at=8)
    name = prefix.split(":")[1]
    writer.publish(name, "lf", 1)
    with RedisCacheReader(redis_url) as reader:
        assert reader.keys(name) == ["2"]
        assert reader.get(name, 2) == {"id": "2", "v": "B"}
        assert (reader.position(name, 1), reader.position(name, 3)) == (8, 8)  # tombstones
        writer.write(truncated, batch_id=2, position=10, truncated_at=8)  # a replay
        assert reader.keys(name) == ["2"] and reader.get(name, 2) == {"id": "2", "v": "B"}
        # a zombie writer's older batch cannot bring a truncated key back
        zombie = RedisCacheWriter(redis_url, prefix, key="id", checkpoint="_zombie")
        result = zombie.write(redis_rows({"id": 3, "v": "c", "_position": 6}), batch_id=1,
                              position=7)
        assert (result.written, result.refused) == (0, 1)
        assert reader.keys(name) == ["2"]
        # rows without _position carry the batch's end: a truncate right at the start of
        # the next batch still removes them
        writer.write(redis_rows({"id": 4, "v": "d"}), batch_id=3, position=12)
        writer.write(redis_rows({"id": 5, "v": "e"}), batch_id=4, position=14, truncated_at=12)
        assert reader.keys(name) == ["5"]
    zombie.close()
    writer.close()


# --------------------------------------------------------------------------- search


def test_search_truncate_replaces_the_index_in_one_commit(tmp_path):
    layout = IndexLayout.from_arrow(pa.schema([("id", pa.int64()), ("name", pa.string()),
                                               ("_position", pa.int64())]),
                                    key="id", text=("name",))
    writer = SearchIndexWriter(tmp_path / "ix", layout)
    writer.write(pa.Table.from_pylist([{"id": 1, "name": "oak lamp", "_position": 1},
                                       {"id": 2, "name": "oak chair", "_position": 2}]),
                 batch_id=0)
    after = pa.Table.from_pylist([{"id": 2, "name": "birch chair", "_position": 4},
                                  {"id": 3, "name": "oak table", "_position": 5}])
    writer.write(after, batch_id=1, replace=True)
    assert writer.write(after, batch_id=1, replace=True).skipped
    reader = SearchIndexReader(lambda view: str(tmp_path / "ix"))
    assert reader.count("v") == 2
    assert sorted(h.key for h in reader.search("v", "oak")) == ["3"]
    assert (reader.get("v", 2) or {}).get("name") == "birch chair"
    writer.write(pa.Table.from_pylist([], schema=after.schema), batch_id=2, replace=True)
    assert reader.count("v") == 0 and writer.checkpoint == 2
    writer.close()


# --------------------------------------------------------------------------- the source side


def changelog_batch(ops: list[tuple[str, int, str | None]], first: int = 1) -> pa.RecordBatch:
    """Changelog records as a projection source reads them (metadata columns, then data)."""
    rows = [{"_position": first + i, "_type": op, "_deleted": op == "delete",
             "id": None if op == "truncate" else key, "v": value if op in ("insert", "update")
             else None} for i, (op, key, value) in enumerate(ops)]
    schema = pa.schema([("_position", pa.int64()), ("_type", pa.string()),
                        ("_deleted", pa.bool_()), ("id", pa.int64()), ("v", pa.string())])
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def test_source_modes():
    batch = changelog_batch([("insert", 1, "a"), ("truncate", 0, None), ("insert", 2, "b"),
                             ("update", 1, "x"), ("truncate", 0, None), ("insert", 3, "c")])
    assert apply_mode(batch, "keep", truncates=(2, 5)) is batch
    assert apply_mode(batch, "drop", truncates=(2, 5)).column("_position").to_pylist() == \
        [1, 3, 4, 6]
    assert apply_mode(batch, "cut", truncates=(2, 5)).column("_position").to_pylist() == [6]
    # a partition before the batch's last truncate keeps nothing
    assert cut_records(batch.slice(0, 3), 5).num_rows == 0
    fanned = fan_out(batch, ["7", "8"], (2, 5)).to_pylist()
    assert [(r["_position"], r["_type"], r["_fan_key"], r["_truncated_at"]) for r in fanned] == [
        (1, "insert", None, 2), (3, "insert", None, 5), (4, "update", None, 5),
        (6, "insert", None, None),
        (2, "truncate", "7", None), (2, "truncate", "8", None),
        (5, "truncate", "7", None), (5, "truncate", "8", None)]


OPS = st.lists(st.tuples(st.sampled_from(["insert", "update", "delete", "truncate"]),
                         st.integers(0, 5), st.sampled_from(["a", "b", "c"])),
               min_size=1, max_size=40)


def oracle(ops: list[tuple[str, int, str | None]]) -> dict[int, str]:
    """The table the changelog describes: replay it."""
    table: dict[int, str] = {}
    for op, key, value in ops:
        if op == "truncate":
            table.clear()
        elif op == "delete":
            table.pop(key, None)
        else:
            table[key] = str(value)
    return table


def micro_batches(ops: list[tuple[str, int, str | None]], cuts: list[int]
                  ) -> list[tuple[pa.Table, int, tuple[int, ...]]]:
    """The micro-batches a live projection in mode ``cut`` writes: (rows, end, truncates)."""
    bounds = sorted({0, len(ops), *(c % (len(ops) + 1) for c in cuts)})
    batches = []
    for low, high in itertools.pairwise(bounds):
        batch = changelog_batch(ops[low:high], first=low + 1)
        truncates = tuple(low + 1 + i for i, (op, _, _) in enumerate(ops[low:high])
                          if op == "truncate")
        rows = pa.Table.from_batches([apply_mode(batch, "cut", truncates=truncates)])
        batches.append((rows.select(["id", "v", "_position", "_deleted"]), high + 1,
                        truncates))
    return batches


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(ops=OPS, cuts=st.lists(st.integers(0, 40), max_size=6), replay=st.integers(0, 10))
def test_redis_view_equals_the_replayed_changelog(redis_url, ops, cuts, replay):
    prefix = f"lf:p{uuid.uuid4().hex[:8]}:g1:"
    writer = RedisCacheWriter(redis_url, prefix, key="id", format="json")
    batches = micro_batches(ops, cuts)
    for batch_id, (rows, end, truncates) in enumerate(batches):
        for _ in range(2 if batch_id == replay % len(batches) else 1):  # one batch twice
            writer.write(rows, batch_id=batch_id, position=end,
                         truncated_at=truncates[-1] if truncates else None)
    name = prefix.split(":")[1]
    writer.publish(name, "lf", 1)
    with RedisCacheReader(redis_url) as reader:
        view = {int(k): (reader.get(name, k) or {}).get("v") for k in reader.keys(name)}
    writer.close()
    assert view == oracle(ops)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(ops=OPS, cuts=st.lists(st.integers(0, 40), max_size=4), replay=st.integers(0, 10))
def test_delta_upsert_view_equals_the_replayed_changelog(tmp_path, ops, cuts, replay):
    path = str(tmp_path / uuid.uuid4().hex)
    writer = DeltaViewWriter(delta_table("upsert", keys=["id"]), path, app_id="v@1", name="v")
    batches = micro_batches(ops, cuts)
    for batch_id, (rows, _, truncates) in enumerate(batches):
        for _ in range(2 if batch_id == replay % len(batches) else 1):
            writer.write_arrow(rows, batch_id, replace=bool(truncates))
    view = delta_rows(path) if DeltaTable.is_deltatable(path) else {}
    assert view == oracle(ops)


# --------------------------------------------------------------------------- registration


def test_a_view_that_cannot_apply_a_truncate_exactly_is_refused(pg, spark):
    from lakefold.projections import Fold, Registry, changelog, events, projection, redis_cache
    from lakefold.projections.exceptions import ProjectionDefinitionError
    from lakefold.projections.operations import registering_into
    from lakefold.projections.runtime._queries import validate
    from tests.projections import helpers

    with registering_into(Registry()):
        with pytest.raises(ProjectionDefinitionError,
                           match=r"projection mixed: it reads several sources \(changelog "
                                 r"public.customers; events of category order\) into a redis "
                                 r"target. A TRUNCATE of public.customers .* one projection per "
                                 r"source, or a Fold"):
            projection("mixed", sources=[changelog("customers"), events("order")],
                       target=redis_cache(key="id"))(lambda customers, order: customers)
        projection("log", sources=[changelog("customers"), events("order")],
                   target=delta_table("append"))(lambda customers, order: customers)

    helpers.create_shop(pg.dsn)
    helpers.capture_now(pg.dsn)
    registry = Registry()
    with registering_into(registry):
        fold = Fold("names", sources=[changelog("customers"), changelog("products")], key="id",
                    schema="id bigint, name string", target=redis_cache(key="id"))
        fold.on("insert", "update", "delete")(lambda state, record: state)
    with pytest.raises(ProjectionDefinitionError,
                       match=r"fold names reads several sources .* but has no handler for "
                             r"truncates. A TRUNCATE of public.customers or public.products .*"
                             r"@names.on\(..., 'truncate'\)"):
        validate(spark, registry, pg.dsn)
    fold.on("truncate")(lambda state, record: state)
    assert list(validate(spark, registry, pg.dsn)) == ["names"]
