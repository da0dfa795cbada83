"""The exactly-once Delta sink: modes, replays, schema evolution, bad input, concurrency."""

from __future__ import annotations

import threading
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakefold.spark import (
    DeltaTarget,
    NotADeltaTableError,
    SchemaMergeError,
    SparkLayerError,
    WriteMode,
    read_delta,
    write_batch,
)
from lakefold.spark._delta_commit import CommitPolicy, commit_files, is_committed
from lakefold.spark._delta_files import (
    FileWriteSpec,
    WrittenFile,
    file_from_row,
    write_task_files,
)
from lakefold.spark._delta_schema import plan_write

pytestmark = pytest.mark.timeout(120)


def rows(spark, path, order: str = "id") -> list[dict[str, object]]:
    return [r.asDict() for r in read_delta(spark, str(path)).orderBy(order).collect()]


def delta_rows(path, order: str = "id") -> list[dict[str, object]]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table().to_pylist(), key=lambda r: r[order])


def data_files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*.parquet") if "_delta_log" not in p.parts)


def test_append_commits_once_and_replay_is_a_no_op(spark, tmp_path):
    target = DeltaTarget(tmp_path / "t", app_id="orders@1")
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id INT, v STRING")
    first = write_batch(df, target, 0)
    assert not first.skipped and first.rows_written == 2 and first.files_added >= 1
    version = DeltaTable(target.path).version()
    files_before = data_files(tmp_path / "t")

    again = write_batch(df, target, 0)
    assert again.skipped and again.rows_written == 0
    # An older batch id is skipped too: the table moves forward only.
    assert write_batch(df, target, 0).skipped
    assert DeltaTable(target.path).version() == version
    assert data_files(tmp_path / "t") == files_before
    assert rows(spark, target.path) == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]

    write_batch(spark.createDataFrame([(3, "c")], "id INT, v STRING"), target, 1)
    assert DeltaTable(target.path).transaction_version("orders@1") == 1
    assert [r["id"] for r in rows(spark, target.path)] == [1, 2, 3]
    # Another app id has its own sequence of batch ids.
    other = DeltaTarget(tmp_path / "t", app_id="orders@2")
    assert not write_batch(spark.createDataFrame([(4, "d")], "id INT, v STRING"), other, 0).skipped
    assert [r["id"] for r in rows(spark, target.path)] == [1, 2, 3, 4]


def test_empty_batch_records_the_batch_id(spark, tmp_path):
    target = DeltaTarget(tmp_path / "t", app_id="p@1")
    write_batch(spark.createDataFrame([], "id INT, v STRING"), target, 7)
    assert DeltaTable(target.path).transaction_version("p@1") == 7
    assert rows(spark, target.path) == []


def test_upsert_with_tombstones_is_idempotent(spark, tmp_path):
    target = DeltaTarget(tmp_path / "t", mode=WriteMode.UPSERT, app_id="c@1", keys=("id",),
                         deleted_column="deleted")
    schema = "id INT, name STRING, deleted BOOLEAN"
    write_batch(spark.createDataFrame(
        [(1, "ann", False), (2, "bob", False), (3, "cy", False)], schema), target, 0)
    batch = spark.createDataFrame(
        [(1, "ANN", False), (2, None, True), (4, "dee", False), (5, "ghost", True)], schema)
    write_batch(batch, target, 1)
    expected = [{"id": 1, "name": "ANN"}, {"id": 3, "name": "cy"}, {"id": 4, "name": "dee"}]
    assert rows(spark, target.path) == expected
    assert "deleted" not in DeltaTable(target.path).schema().to_arrow().names
    version = DeltaTable(target.path).version()
    assert write_batch(batch, target, 1).skipped
    assert DeltaTable(target.path).version() == version
    assert rows(spark, target.path) == expected
    assert not (tmp_path / "t" / "_lakefold_staging").exists() or not any(
        (tmp_path / "t" / "_lakefold_staging").iterdir())


def test_upsert_order_by_keeps_latest_and_duplicates_without_it_fail(spark, tmp_path):
    schema = "id INT, seq LONG, v STRING"
    dupes = spark.createDataFrame([(1, 1, "old"), (1, 3, "new"), (1, 2, "mid"), (2, 1, "x")],
                                  schema)
    plain = DeltaTarget(tmp_path / "t", mode=WriteMode.UPSERT, app_id="p@1", keys=("id",))
    with pytest.raises(SparkLayerError, match="more than one row"):
        write_batch(dupes, plain, 0)
    assert not (tmp_path / "t" / "_delta_log").exists() or (
        DeltaTable(plain.path).transaction_version("p@1") is None)

    ordered = DeltaTarget(tmp_path / "t", mode=WriteMode.UPSERT, app_id="p@1", keys=("id",),
                          order_by="seq")
    write_batch(dupes, ordered, 0)
    assert rows(spark, ordered.path) == [{"id": 1, "seq": 3, "v": "new"},
                                         {"id": 2, "seq": 1, "v": "x"}]


def test_null_key_is_refused(spark, tmp_path):
    target = DeltaTarget(tmp_path / "t", mode=WriteMode.UPSERT, app_id="p@1", keys=("id",))
    write_batch(spark.createDataFrame([(1, "a")], "id INT, v STRING"), target, 0)
    version = DeltaTable(target.path).version()
    with pytest.raises(SparkLayerError, match="null key 'id'"):
        write_batch(spark.createDataFrame([(None, "a")], "id INT, v STRING"), target, 1)
    assert DeltaTable(target.path).version() == version


def test_delete_by_key_and_composite_keys(spark, tmp_path):
    upsert = DeltaTarget(tmp_path / "t", mode=WriteMode.UPSERT, app_id="p@1", keys=("Tenant", "id"))
    schema = "Tenant STRING, id INT, v STRING"
    write_batch(spark.createDataFrame(
        [("a", 1, "x"), ("a", 2, "y"), ("b", 1, "z")], schema), upsert, 0)
    delete = DeltaTarget(tmp_path / "t", mode=WriteMode.DELETE, app_id="p@1-del",
                         keys=("Tenant", "id"))
    tombstones = spark.createDataFrame([("a", 1), ("c", 9)], "Tenant STRING, id INT")
    write_batch(tombstones, delete, 0)
    write_batch(tombstones, delete, 0)
    assert rows(spark, upsert.path, order="Tenant") == [
        {"Tenant": "a", "id": 2, "v": "y"}, {"Tenant": "b", "id": 1, "v": "z"}]


def test_overwrite_replaces_the_table(spark, tmp_path):
    target = DeltaTarget(tmp_path / "t", mode=WriteMode.OVERWRITE, app_id="agg@1")
    write_batch(spark.createDataFrame([(1, 10), (2, 20)], "id INT, total LONG"), target, 0)
    write_batch(spark.createDataFrame([(1, 15)], "id INT, total LONG"), target, 1)
    assert rows(spark, target.path) == [{"id": 1, "total": 15}]
    assert rows(spark, target.path) == delta_rows(target.path)


def test_schema_evolution_adds_columns_and_widens(spark, tmp_path):
    target = DeltaTarget(tmp_path / "t", app_id="p@1")
    write_batch(spark.createDataFrame([(1, "a")], "id INT, v STRING"), target, 0)
    result = write_batch(
        spark.createDataFrame([(2, "b", 2.5)], "id SHORT, v STRING, score DOUBLE"), target, 1)
    assert result.columns_added == ("score",)
    assert rows(spark, target.path) == [{"id": 1, "v": "a", "score": None},
                                        {"id": 2, "v": "b", "score": 2.5}]
    # A batch without a column writes nulls for it.
    write_batch(spark.createDataFrame([(3,)], "id INT"), target, 2)
    assert rows(spark, target.path)[-1] == {"id": 3, "v": None, "score": None}
    assert rows(spark, target.path) == delta_rows(target.path)


def test_unmergeable_schema_change_commits_nothing(spark, tmp_path):
    target = DeltaTarget(tmp_path / "t", app_id="p@1")
    write_batch(spark.createDataFrame([(1, "a")], "id INT, v STRING"), target, 0)
    version = DeltaTable(target.path).version()
    files = data_files(tmp_path / "t")
    bad = spark.createDataFrame([("x", "a", 1)], "id STRING, v STRING, extra INT")
    with pytest.raises(SchemaMergeError, match="column 'id' is integer in the table but string"):
        write_batch(bad, target, 1)
    case_clash = spark.createDataFrame([(1, "a", 1)], "id INT, v STRING, V INT")
    with pytest.raises(SparkLayerError):
        write_batch(case_clash, target, 1)
    assert DeltaTable(target.path).version() == version
    assert DeltaTable(target.path).schema().to_arrow().names == ["id", "v"]
    assert data_files(tmp_path / "t") == files
    partitioned = DeltaTarget(tmp_path / "t", app_id="p@1", partition_by=("v",))
    with pytest.raises(SchemaMergeError, match="partitioned by nothing"):
        write_batch(spark.createDataFrame([(1, "a")], "id INT, v STRING"), partitioned, 1)


def test_non_delta_path_is_refused(spark, tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "notes.txt").write_text("not a table")
    target = DeltaTarget(tmp_path / "t", app_id="p@1")
    with pytest.raises(NotADeltaTableError, match="not a Delta table"):
        write_batch(spark.createDataFrame([(1,)], "id INT"), target, 0)
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["notes.txt"]
    with pytest.raises(NotADeltaTableError):
        read_delta(spark, str(tmp_path / "t"))


def test_bad_target_options_are_refused(tmp_path):
    with pytest.raises(SparkLayerError, match="needs keys"):
        DeltaTarget(tmp_path, mode=WriteMode.UPSERT)
    with pytest.raises(SparkLayerError, match="unknown Delta write mode 'merge'"):
        DeltaTarget(tmp_path, mode="merge")  # type: ignore[arg-type]
    with pytest.raises(SparkLayerError, match="batch id"):
        DeltaTarget(tmp_path).check_batch_id(-1)


def test_partitioned_write_and_second_readers_agree(spark, tmp_path):
    target = DeltaTarget(tmp_path / "t", app_id="p@1", partition_by=("region",))
    data = [(i, ["eu", "us", "a b/c=d", None][i % 4], f"v{i}") for i in range(40)]
    write_batch(spark.createDataFrame(data, "id INT, region STRING, v STRING"), target, 0)
    dirs = sorted(p.name for p in (tmp_path / "t").iterdir() if p.name.startswith("region="))
    assert dirs == ["region=__HIVE_DEFAULT_PARTITION__", "region=a%20b%2Fc%3Dd",
                    "region=eu", "region=us"]
    expected = [{"id": i, "region": r, "v": v} for i, r, v in data]
    assert rows(spark, target.path) == expected
    assert delta_rows(target.path) == expected
    assert pl.read_delta(target.path).sort("id").to_dicts() == expected


def test_concurrent_writers_each_land_once(tmp_path):
    """Real concurrent delta-rs commits: distinct app ids all land; the same batch of the same
    app id lands exactly once however many writers race for it."""
    path = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64())])
    DeltaTable.create(path, schema)

    def files_for(ids: list[int]) -> list[WrittenFile]:
        spec = FileWriteSpec(path, "", schema, ())
        out = write_task_files(spec, iter([pa.record_batch([pa.array(ids, pa.int64())],
                                                            schema=schema)]))
        return [file_from_row(r) for b in out for r in b.to_pylist()]

    def commit(app_id, batch_id, ids, results):
        target = DeltaTarget(path, app_id=app_id)
        plan = plan_write(target, schema, DeltaTable(path).schema(), [])
        table = DeltaTable(path)
        results.append(commit_files(table, target, batch_id, plan, files_for(ids),
                                    CommitPolicy(attempts=20, first_backoff_s=0.01)))

    results: list[tuple[bool, int, tuple[str, ...]]] = []
    threads = [threading.Thread(target=commit, args=(f"app{i}", 0, [i], results))
               for i in range(6)]
    threads += [threading.Thread(target=commit, args=("same", 3, [100], results))
                for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    table = DeltaTable(path)
    ids = sorted(table.to_pyarrow_table().column("id").to_pylist())
    assert ids == [0, 1, 2, 3, 4, 5, 100]
    assert sum(1 for skipped, _, _ in results if not skipped) == 7
    assert is_committed(table, "same", 3)
