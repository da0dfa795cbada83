"""``lakefold bench delta-spark``: lakefold's Delta paths (delta-rs) against delta-spark 4.4.0
(the jars of ``make peers``) on the same tables, in the same Spark driver, same run.

Set-up (local Spark with delta-spark on, as ``LAKEFOLD_DELTA_SPARK=true`` starts it):

- ``big``: ``--rows`` rows (``id``, ``customer``, ``amount`` decimal, ``at`` timestamp) written
  by lakefold's append target (``DeltaViewWriter.append_arrow``) in ``--commits`` commits;
- ``keyed``: ``--keyed-rows`` rows written by lakefold's upsert target (``write_arrow``), then
  ``--small-commits`` live-sized batches of 100 changed keys (one commit each: the log a live
  projection's table has), then vacuumed (each merge rewrote the files its keys were in: some
  30 MB a merge at the defaults, kept until a vacuum).

Each figure is the best of ``--rounds`` (seconds; after one untimed round):

- ``scan_s`` / ``keyed_scan_s``: the table into Spark and a full aggregation (count, sum of
  ``amount``, max of ``at``) collected: lakefold's ``read_delta`` (delta-rs picks the files,
  Spark's Parquet reader reads them) against ``spark.read.format("delta")``.
- ``open_s`` / ``keyed_open_s``: only the DataFrame's creation (the log read and the plan).
- ``time_travel_scan_s``: the same aggregation at version ``--commits // 2``.
- ``merge_s``: one batch of ``--merge-keys`` changed keys merged into ``keyed`` (each round a
  new batch): lakefold's driver merge (delta-rs, with its app transaction) against delta-spark's
  ``MERGE INTO`` from a cached DataFrame of the same rows.
- ``optimize_s``: compacting a copy of ``keyed`` (many small files): lakefold's
  ``optimize_table`` (delta-rs) against delta-spark's ``OPTIMIZE``, once each.

``results`` are lakefold's paths, ``baseline`` delta-spark's, ``results.ratio_*`` lakefold's
seconds over delta-spark's (below 1: lakefold is faster). Both readers' aggregates must agree,
and both merges must leave the same rows; the run fails otherwise.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import typer

from lakefold._bench import bench_app
from lakefold._bench.report import BenchmarkError, Report

_EPOCH_US = 1_790_000_000_000_000
_SCHEMA = pa.schema([("id", pa.int64()), ("customer", pa.string()),
                     ("amount", pa.decimal128(12, 2)), ("at", pa.timestamp("us", tz="UTC")),
                     ("_position", pa.int64())])


def _rows(start: int, count: int, *, ids: np.ndarray | None = None, seed: int = 0) -> pa.Table:
    """``count`` rows with positions from ``start`` (ids: ``ids``, or the positions)."""
    rng = np.random.default_rng(seed + start)
    positions = np.arange(start, start + count, dtype=np.int64)
    amounts = pa.array(rng.integers(1, 1_000_000, count), pa.int32())
    return pa.table({
        "id": ids if ids is not None else positions,
        "customer": pa.array([f"c{i % 9973}" for i in positions.tolist()]),
        "amount": amounts.cast(pa.decimal128(12, 2)),
        "at": pa.array(_EPOCH_US + positions * 1_000, pa.timestamp("us", tz="UTC")),
        "_position": positions,
    }, schema=_SCHEMA)


def _reading(read: Callable[[str, int | None], Any], path: str, version: int | None,
             scan: bool) -> Callable[[], tuple[Any, ...]]:
    """One timed step: the DataFrame (and its schema), and with ``scan`` the aggregation."""
    def step() -> tuple[Any, ...]:
        frame = read(path, version)
        if scan:
            return _aggregate(frame)
        frame.schema  # noqa: B018  # the plan is analysed: the log is read
        return ()
    return step


def _best_pair(rounds: int, ours: Callable[[], tuple[Any, ...]],
               theirs: Callable[[], tuple[Any, ...]]
               ) -> tuple[tuple[float, tuple[Any, ...]], tuple[float, tuple[Any, ...]]]:
    """The fastest of ``rounds`` timed calls of each, taken in turn (ours, theirs, ours...)
    after one untimed call of each, so that the JVM's warming helps neither; with the last
    answer of each."""
    times: tuple[list[float], list[float]] = ([], [])
    answers: list[tuple[Any, ...]] = [(), ()]
    for round_ in range(-1, rounds):
        for i, step in enumerate((ours, theirs)):
            began = time.perf_counter()
            answers[i] = step()
            if round_ >= 0:
                times[i].append(time.perf_counter() - began)
    return (round(min(times[0]), 4), answers[0]), (round(min(times[1]), 4), answers[1])


def _best(rounds: int, step: Callable[[int], object]) -> float:
    """The fastest of ``rounds`` timed calls, after one untimed call (its round is -1)."""
    step(-1)
    times = []
    for round_ in range(rounds):
        began = time.perf_counter()
        step(round_)
        times.append(time.perf_counter() - began)
    return round(min(times), 4)


def _aggregate(frame: Any) -> tuple[Any, ...]:
    from pyspark.sql import functions as F

    row = frame.agg(F.count("*"), F.sum("amount"), F.max("at")).collect()[0]
    return tuple(row)


def run(rows: int, commits: int, keyed_rows: int, small_commits: int, merge_keys: int,
        rounds: int) -> Report:
    """Run the whole benchmark; see the module docstring."""
    from deltalake import DeltaTable

    from lakefold.projections import delta_table
    from lakefold.projections.operations import DeltaViewWriter
    from lakefold.spark import optimize_table, read_delta, spark_session, vacuum_table
    from lakefold.spark.operations import DELTA_SPARK_VERSION, with_delta_spark

    report = Report("delta-spark", {
        "rows": rows, "commits": commits, "keyed_rows": keyed_rows,
        "small_commits": small_commits, "merge_keys": merge_keys, "rounds": rounds,
        "delta_spark": DELTA_SPARK_VERSION})
    scratch = Path(tempfile.mkdtemp(prefix="lakefold-bench-delta-spark-"))
    try:
        big = DeltaViewWriter(delta_table("append"), str(scratch / "big"), app_id="big@1",
                              name="big")
        per_commit = rows // commits
        began = time.perf_counter()
        for batch in range(commits):
            big.append_arrow(_rows(batch * per_commit, per_commit), batch)
        report.params["write_big_s"] = round(time.perf_counter() - began, 2)
        keyed = DeltaViewWriter(delta_table("upsert", keys=["id"]), str(scratch / "keyed"),
                                app_id="keyed@1", name="keyed")
        keyed.write_arrow(_rows(0, keyed_rows), 0)
        rng = np.random.default_rng(39)
        position = keyed_rows
        for batch in range(1, small_commits + 1):
            ids = rng.integers(0, keyed_rows, 100)
            keyed.write_arrow(_rows(position, 100, ids=ids), batch)
            position += 100
        next_batch = small_commits + 1
        # Each merge rewrote the files its keys were in; the copies below take the live ones.
        vacuum_table(keyed.path, retention_hours=0, enforce_retention=False)

        spark = spark_session(conf=with_delta_spark({"spark.sql.shuffle.partitions": "4"}),
                              app_name="lakefold-bench-delta-spark")
        try:
            def lakefold_read(path: str, version: int | None = None) -> Any:
                return read_delta(spark, path, version=version)

            def delta_spark_read(path: str, version: int | None = None) -> Any:
                reader = spark.read.format("delta")
                if version is not None:
                    reader = reader.option("versionAsOf", version)
                return reader.load(path)

            middle = commits // 2
            answers: dict[str, tuple[Any, ...]] = {}
            for metric, path, version, scan in (
                    ("open_s", big.path, None, False), ("scan_s", big.path, None, True),
                    ("time_travel_scan_s", big.path, middle, True),
                    ("keyed_open_s", keyed.path, None, False),
                    ("keyed_scan_s", keyed.path, None, True)):
                ours, theirs = _best_pair(rounds, _reading(lakefold_read, path, version, scan),
                                          _reading(delta_spark_read, path, version, scan))
                report.results[metric], report.baseline[metric] = ours[0], theirs[0]
                if ours[1] != theirs[1]:
                    raise BenchmarkError(f"{metric}: the readers disagree: {ours} {theirs}")
                answers[metric] = ours[1]
            report.params["answers"] = {k: [str(v) for v in a] for k, a in answers.items()
                                        if a}

            # Merges: the same changed keys, each round a new batch, into two equal copies.
            shutil.copytree(keyed.path, scratch / "keyed-spark")
            spark_path = str(scratch / "keyed-spark")
            batches = [_rows(position + i * merge_keys, merge_keys, seed=i,
                             ids=rng.integers(0, keyed_rows, merge_keys))
                       for i in range(rounds + 1)]

            def delta_rs_merge(round_: int) -> None:
                keyed.write_arrow(batches[round_ + 1], next_batch + round_ + 1)

            def delta_spark_merge(round_: int) -> None:
                spark.sql(
                    f"MERGE INTO delta.`{spark_path}` t USING merge_source s ON t.id = s.id "
                    "WHEN MATCHED THEN UPDATE SET * "
                    "WHEN NOT MATCHED THEN INSERT *")

            def prepared(round_: int) -> None:
                source = spark.createDataFrame(
                    _latest(batches[round_ + 1])).cache()
                source.count()
                source.createOrReplaceTempView("merge_source")

            report.results["merge_s"] = _best(rounds, delta_rs_merge)
            spark_times = []
            for round_ in range(-1, rounds):
                prepared(round_)
                began = time.perf_counter()
                delta_spark_merge(round_)
                if round_ >= 0:
                    spark_times.append(time.perf_counter() - began)
            report.baseline["merge_s"] = round(min(spark_times), 4)
            merged = sorted(DeltaTable(keyed.path).to_pyarrow_table().select(
                ["id", "amount", "_position"]).to_pylist(), key=lambda r: r["id"])
            merged_spark = sorted(DeltaTable(spark_path).to_pyarrow_table().select(
                ["id", "amount", "_position"]).to_pylist(), key=lambda r: r["id"])
            if merged != merged_spark:
                raise BenchmarkError("the two merges left different rows")

            # OPTIMIZE, once each, on copies of the many-small-files table.
            for copy in ("optimize-rs", "optimize-spark"):
                shutil.copytree(keyed.path, scratch / copy)
            files = len(DeltaTable(keyed.path).file_uris())
            began = time.perf_counter()
            compacted = optimize_table(str(scratch / "optimize-rs"))
            report.results["optimize_s"] = round(time.perf_counter() - began, 4)
            began = time.perf_counter()
            metrics = spark.sql(f"OPTIMIZE delta.`{scratch / 'optimize-spark'}`").collect()[
                0]["metrics"]
            report.baseline["optimize_s"] = round(time.perf_counter() - began, 4)
            # Not like for like: delta-rs aims at the table's delta.targetFileSize (lakefold
            # sets it when it creates a keyed table), delta-spark at its own 1 GB default.
            report.params["optimize_files"] = {
                "before": files,
                "delta_rs_removed_added": [compacted.files_removed, compacted.files_added],
                "delta_spark_removed_added": [int(metrics["numFilesRemoved"]),
                                              int(metrics["numFilesAdded"])]}
        finally:
            spark.stop()
        for metric in ("open_s", "scan_s", "time_travel_scan_s", "keyed_open_s",
                       "keyed_scan_s", "merge_s", "optimize_s"):
            report.results[f"ratio_{metric}"] = round(
                report.results[metric] / report.baseline[metric], 3)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def _latest(rows: pa.Table) -> pa.Table:
    """One row per id, the highest position: what lakefold's merge keeps (delta-spark's
    MERGE refuses a source with two rows for one target row)."""
    ordered = rows.sort_by([("id", "ascending"), ("_position", "descending")])
    ids = ordered.column("id").to_numpy()
    first = np.ones(len(ids), dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    return ordered.filter(pa.array(first))


@bench_app.command("delta-spark")
def delta_spark(
    rows: Annotated[int, typer.Option(help="Rows of the big append table.")] = 10_000_000,
    commits: Annotated[int, typer.Option(help="Commits that write the big table.")] = 20,
    keyed_rows: Annotated[int, typer.Option(help="Rows of the keyed upsert table.")]
    = 1_000_000,
    small_commits: Annotated[int, typer.Option(help="Live-sized upserts (100 keys) into "
                                                    "the keyed table.")] = 100,
    merge_keys: Annotated[int, typer.Option(help="Changed keys per measured merge.")] = 1_000,
    rounds: Annotated[int, typer.Option(help="Timed rounds per figure (best kept).")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """lakefold's Delta reads, merge and OPTIMIZE (delta-rs) against delta-spark's, same
    tables, same Spark driver (needs delta-spark's jars: `make peers`)."""
    if rows < commits or commits < 2 or keyed_rows < 100 or small_commits < 1 \
            or merge_keys < 1 or rounds < 1:
        raise BenchmarkError("need --rows >= --commits >= 2, --keyed-rows >= 100, "
                             "--small-commits >= 1, --merge-keys >= 1 and --rounds >= 1")
    run(rows, commits, keyed_rows, small_commits, merge_keys, rounds).emit(as_json=as_json)
