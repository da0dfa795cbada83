"""The Delta target: SCD2 history (exactly once per batch) and the Spark sink modes."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings, strategies as st

from lakefold.projections.definitions._target_specs import check_columns, delta_table
from lakefold.projections.exceptions import IncompatibleTargetError, MissingKeyError
from lakefold.projections.targets._delta import DeltaViewWriter

pytestmark = pytest.mark.timeout(120)

SCHEMA = pa.schema([("id", pa.int64()), ("price", pa.decimal128(10, 2)),
                    ("_ts", pa.timestamp("us", tz="UTC")), ("_position", pa.int64()),
                    ("_deleted", pa.bool_())])


def t(day: int) -> dt.datetime:
    return dt.datetime(2024, 1, day, tzinfo=dt.UTC)


def changes(*items: tuple[int, str | None, int, int, bool]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"id": i, "price": Decimal(p) if p else None, "_ts": t(d), "_position": pos,
          "_deleted": deleted} for i, p, d, pos, deleted in items], schema=SCHEMA)


def history(path: str) -> list[tuple[object, ...]]:
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    return sorted((r["id"], str(r["price"]), r["valid_from"].day,
                   r["valid_to"].day if r["valid_to"] else None, r["current"]) for r in rows)


def test_scd2_history_is_exact_and_replays_are_no_ops(tmp_path):
    path = str(tmp_path / "prices")
    writer = DeltaViewWriter(delta_table("scd2", keys=["id"]), path, app_id="p@1", name="p")
    writer.write_scd2(changes((1, "10.00", 1, 1, False), (2, "5.00", 1, 2, False),
                              (1, "11.00", 2, 3, False)), batch_id=0)
    # unchanged price: no new version; a delete closes; a re-insert opens a new version
    writer.write_scd2(changes((1, "11.00", 3, 4, False), (2, None, 4, 5, True),
                              (3, "1.00", 4, 6, False)), batch_id=1)
    assert writer.write_scd2(changes((9, "9.99", 9, 9, False)), batch_id=1).skipped
    writer.write_scd2(changes((2, "6.00", 5, 7, False), (1, "12.00", 6, 8, False)), batch_id=2)
    assert history(path) == [
        (1, "10.00", 1, 2, False), (1, "11.00", 2, 6, False), (1, "12.00", 6, None, True),
        (2, "5.00", 1, 4, False), (2, "6.00", 5, None, True),
        (3, "1.00", 4, None, True),
    ]
    assert DeltaTable(path).transaction_version("p@1") == 2


def test_target_column_checks():
    scd2 = delta_table("scd2", keys=["id"])
    types = {"id": "bigint", "price": "decimal(10,2)", "_ts": "timestamp", "_position": "bigint"}
    check_columns(scd2, list(types), types)
    with pytest.raises(MissingKeyError, match="key column 'id'"):
        check_columns(scd2, ["price", "_ts", "_position"], types)
    with pytest.raises(MissingKeyError, match="_position"):
        check_columns(scd2, ["id", "price", "_ts"], types)
    with pytest.raises(IncompatibleTargetError, match="not a timestamp"):
        check_columns(scd2, list(types), {**types, "_ts": "string"})
    with pytest.raises(IncompatibleTargetError, match="columns named"):
        check_columns(scd2, [*types, "current"], types)
    with pytest.raises(IncompatibleTargetError, match="cannot delete"):
        check_columns(delta_table("append"), ["id", "_deleted"], {})
    with pytest.raises(IncompatibleTargetError, match="partition column"):
        check_columns(delta_table("append", partition_by=["day"]), ["id"], {})


def test_upsert_through_the_spark_sink(spark, tmp_path):
    path = str(tmp_path / "rev")
    writer = DeltaViewWriter(delta_table("upsert", keys=["customer_id"]), path,
                             app_id="rev@1", name="rev")
    df = spark.createDataFrame(
        [(1, 10.0, 1, False), (1, 12.0, 2, False), (2, 3.0, 3, False)],
        "customer_id long, revenue double, _position long, _deleted boolean")
    writer.write(df, 0)
    assert writer.write(df, 0).skipped
    writer.write(spark.createDataFrame([(2, 0.0, 4, True)], df.schema), 1)
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    assert [(r["customer_id"], r["revenue"]) for r in rows] == [(1, 12.0)]


def test_a_null_key_is_one_row_upserted_and_deleted_like_any_other(tmp_path):
    """A merge on ``=`` never matches NULL: a NULL key (a view's NULL group) would be inserted
    again at every batch and never deleted."""
    from lakefold.projections.definitions._targets import TargetBatch, TargetContext

    target = delta_table("upsert", keys=["city"]).open(str(tmp_path / "by_city"),
                                                       TargetContext("by_city", 1))
    schema = pa.schema([("city", pa.string()), ("orders", pa.int64()),
                        ("_deleted", pa.bool_())])

    def write(batch: int, *rows: tuple[str | None, int, bool]) -> None:
        target.write(pa.Table.from_pylist(
            [{"city": c, "orders": n, "_deleted": d} for c, n, d in rows], schema=schema),
            TargetBatch(batch, batch))

    def held() -> list[tuple[object, ...]]:
        table = DeltaTable(str(tmp_path / "by_city")).to_pyarrow_table().to_pylist()
        return sorted(((r["city"] or ""), r["orders"]) for r in table)

    write(1, (None, 1, False), ("Oslo", 1, False))
    write(2, (None, 2, False))
    write(3, (None, 3, False), ("Oslo", 2, False))
    assert held() == [("", 3), ("Oslo", 2)]
    write(4, (None, 0, True))
    assert held() == [("Oslo", 2)]



_KEYS = st.one_of(st.none(), st.integers(-3, 300))
_TEXTS = st.one_of(st.none(), st.sampled_from(["a", "o'x", "''", "ü", "a b", "x\\y", ""]))


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(batches=st.lists(st.lists(st.tuples(_KEYS, _TEXTS, st.integers(0, 9), st.booleans()),
                                 max_size=8), min_size=1, max_size=5),
       base=st.sampled_from([0, 70_000]))
def test_upserts_name_their_keys_to_the_merge_and_equal_a_dict(
        tmp_path_factory: pytest.TempPathFactory, batches: list[Any], base: int) -> None:
    """The merge names the batch's keys to the table (``key_filter``) so that delta-rs reads
    only the files that may hold them: over a table first written in key-ordered files (70,000
    rows: several files), batches of upserts and deletes (NULL keys, quotes and a backslash in
    text keys) leave what a dict applying the same batches holds, one row per key."""
    from lakefold.projections.definitions._targets import TargetBatch, TargetContext

    path = str(tmp_path_factory.mktemp("keys"))
    target = delta_table("upsert", keys=["k", "s"]).open(path, TargetContext("keys", 1))
    schema = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.int64()),
                        ("_deleted", pa.bool_())])
    first = [{"k": 1000 + i, "s": "base", "v": i, "_deleted": False} for i in range(base)]
    target.write(pa.Table.from_pylist(first, schema=schema), TargetBatch(1, 1))
    held = {(r["k"], r["s"]): r["v"] for r in first}
    for n, batch in enumerate(batches, start=2):
        rows = [{"k": k, "s": s, "v": v, "_deleted": d} for k, s, v, d in batch]
        target.write(pa.Table.from_pylist(rows, schema=schema), TargetBatch(n, n))
        for row in rows:  # the last row of a key in a batch wins
            if row["_deleted"]:
                held.pop((row["k"], row["s"]), None)
            else:
                held[(row["k"], row["s"])] = row["v"]
    delta = DeltaTable(path)
    assert int(delta.metadata().configuration["delta.targetFileSize"]) >= 1 << 20
    table = delta.to_pyarrow_table(columns=["k", "s", "v"]).to_pylist()
    assert len(table) == len(held)
    assert {(r["k"], r["s"]): r["v"] for r in table} == held
