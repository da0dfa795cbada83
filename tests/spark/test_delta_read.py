"""Reading Delta tables into Spark: time travel, partition pruning, maintenance."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from deltalake import DeltaTable

from lakefold.spark import DeltaTarget, SparkLayerError, WriteMode, read_delta, write_batch
from lakefold.spark._delta_maintenance import optimize_table, vacuum_table
from lakefold.spark._delta_read import load_snapshot

pytestmark = pytest.mark.timeout(120)


def ids(frame) -> list[int]:
    return sorted(r["id"] for r in frame.collect())


def test_time_travel_by_version_and_timestamp(spark, tmp_path):
    target = DeltaTarget(tmp_path / "t", mode=WriteMode.UPSERT, app_id="p@1", keys=("id",))
    write_batch(spark.createDataFrame([(1, "a"), (2, "b")], "id INT, v STRING"), target, 0)
    v1 = DeltaTable(target.path).version()
    time.sleep(0.05)
    between = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    write_batch(spark.createDataFrame([(2, "B"), (3, "c")], "id INT, v STRING"), target, 1)
    delete = DeltaTarget(tmp_path / "t", mode=WriteMode.DELETE, app_id="p@1-d", keys=("id",))
    write_batch(spark.createDataFrame([(1,)], "id INT"), delete, 0)

    assert ids(read_delta(spark, target.path)) == [2, 3]
    past = read_delta(spark, target.path, version=v1)
    assert sorted((r["id"], r["v"]) for r in past.collect()) == [(1, "a"), (2, "b")]
    assert ids(read_delta(spark, target.path, as_of=between)) == [1, 2]
    assert read_delta(spark, target.path, version=0).count() == 0  # created, empty
    with pytest.raises(SparkLayerError, match="cannot load"):
        read_delta(spark, target.path, version=99)


def test_partition_pruning_reads_only_matching_files(spark, tmp_path):
    target = DeltaTarget(tmp_path / "t", app_id="p@1", partition_by=("region",))
    data = [(i, ["eu", "us", "apac"][i % 3]) for i in range(30)]
    write_batch(spark.createDataFrame(data, "id INT, region STRING"), target, 0)
    write_batch(spark.createDataFrame([(100, "eu")], "id INT, region STRING"), target, 1)

    everything = load_snapshot(target.path)
    eu_only = load_snapshot(target.path, partition_filters=[("region", "=", "eu")])
    assert len(eu_only.files) < len(everything.files)
    assert eu_only.files and all("/region=eu/" in f for f in eu_only.files)
    # The pruned file list is all Spark reads.
    frame = read_delta(spark, target.path, partition_filters=[("region", "=", "eu")])
    assert {f.split("/")[-2] for f in frame.inputFiles()} == {"region=eu"}
    assert ids(frame) == [i for i, r in data if r == "eu"] + [100]
    # A SQL predicate prunes the same way, with column statistics as well.
    by_stats = load_snapshot(target.path, partition_filters="region = 'eu' AND id >= 100")
    assert [f.split("/")[-2] for f in by_stats.files] == ["region=eu"]
    assert len(by_stats.files) == 1
    # Without a file filter, a query filter on the partition column is a Spark PartitionFilter.
    plan = read_delta(spark, target.path).filter("region = 'us'")._jdf.queryExecution() \
        .executedPlan().toString()
    assert "PartitionFilters: [isnotnull(region" in plan and "(region#" in plan


def test_optimize_compacts_and_vacuum_removes_orphans(spark, tmp_path):
    target = DeltaTarget(tmp_path / "t", app_id="p@1")
    for batch in range(4):
        write_batch(spark.createDataFrame([(batch,)], "id INT"), target, batch)
    before = load_snapshot(target.path)
    assert len(before.files) >= 4
    result = optimize_table(target.path)
    assert result.files_removed >= 4 and result.files_added == 1
    assert ids(read_delta(spark, target.path)) == [0, 1, 2, 3]
    assert DeltaTable(target.path).transaction_version("p@1") == 3

    orphan = tmp_path / "t" / "part-orphan.c000.snappy.parquet"
    orphan.write_bytes(b"left by a batch that crashed before its commit")
    staging = tmp_path / "t" / "_lakefold_staging" / "p_1-9-abc"
    staging.mkdir(parents=True)
    (staging / "part-x.parquet").write_bytes(b"x")
    with pytest.raises(SparkLayerError, match="refused"):
        vacuum_table(target.path, retention_hours=0)
    # delta-rs counts whole hours: 0.5 would be zero, so a fraction is refused, nothing deleted.
    with pytest.raises(SparkLayerError, match=r"whole hours, got 0.5; pass 1"):
        vacuum_table(target.path, retention_hours=0.5, enforce_retention=False)
    assert orphan.exists()
    dry = vacuum_table(target.path, retention_hours=0, dry_run=True, enforce_retention=False)
    assert orphan.exists() and staging.exists()
    assert "part-orphan.c000.snappy.parquet" in dry.files
    done = vacuum_table(target.path, retention_hours=0, enforce_retention=False)
    assert set(done.files) == set(dry.files)
    assert not orphan.exists() and not staging.exists()
    # The compacted files removed by optimize are gone; the table still reads.
    assert all(not (tmp_path / "t" / f).exists() for f in done.files)
    assert ids(read_delta(spark, target.path)) == [0, 1, 2, 3]
