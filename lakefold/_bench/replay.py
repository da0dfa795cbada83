"""``lakefold bench replay``: the event store into Spark, and replayed into a Delta aggregate.

Loads ``--events`` events into a throwaway PostgreSQL event store (``--per-stream`` events per
stream, payload ``{"amount": n}``), then measures, in one Spark session (``local[*]``):

- ``results.read_events_per_s``: a batch read of every event through the ``lakefold_events``
  source into Spark (all columns materialized by Spark's ``noop`` sink);
- ``results.replay_events_per_s``: the end-to-end replay of a projection: a streaming query over
  ``lakefold_events`` (typed payloads through the event registry, ``--batch-events`` per
  micro-batch) that folds each micro-batch into per-stream totals (events, sum of amounts, last
  position) and upserts them into a Delta table through the exactly-once sink; the table is
  checked against the expected totals afterwards;
- ``baseline.jdbc_read_events_per_s``: Spark's own JDBC reader (``spark.read.jdbc`` with
  ``partitionColumn=position`` and as many partitions as the lakefold source uses) over the same
  rows, through the same ``noop`` sink. The PostgreSQL JDBC driver jar comes from the ``wbjdbc``
  wheel (a dev dependency), Debian's ``libpostgresql-jdbc-java``, or ``--jdbc-jar``.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel

from lakefold._bench import bench_app
from lakefold._bench.report import Report
from lakefold.exceptions import LakefoldError
from lakefold.schemas import EventRegistry

registry = EventRegistry()


@registry.event("account.deposited")
class Deposited(BaseModel):
    """The bench's one event type (workers import this module for the typed payloads)."""

    amount: int


REGISTRY_PATH = "lakefold._bench.replay:registry"
_DEBIAN_JAR = Path("/usr/share/java/postgresql.jar")
_APPEND_BATCH = 1_000
_FLAT_TABLE = "bench_events_flat"


def find_jdbc_jar(explicit: Path | None) -> Path:
    """The PostgreSQL JDBC driver jar, or a LakefoldError saying how to get one."""
    if explicit is not None:
        if not explicit.is_file():
            raise LakefoldError(f"--jdbc-jar {explicit} does not exist")
        return explicit
    spec = importlib.util.find_spec("wbjdbc")  # located, not imported (it starts JPype)
    for location in (spec.submodule_search_locations or []) if spec else []:
        bundled = sorted(Path(location).glob("resources/maven/postgresql/*.jar"))
        if bundled:
            return bundled[-1]
    if _DEBIAN_JAR.is_file():
        return _DEBIAN_JAR
    raise LakefoldError(
        "no PostgreSQL JDBC driver jar for the spark.read.jdbc baseline: install the dev "
        "dependencies (`pip install 'lakefold[dev]'`, which bring wbjdbc's bundled jar), or "
        "`apt-get install libpostgresql-jdbc-java`, or pass --jdbc-jar PATH"
    )


def load_events(dsn: str, events: int, per_stream: int) -> int:
    """Append ``events`` deposits through the EventStore API; return the head position."""
    from lakefold.eventstore import NO_STREAM, EventStore, StreamEvents

    with EventStore(dsn, registry=registry) as store:
        store.install()
        written = 0
        stream = 0
        while written < events:
            group = []
            for _ in range(max(1, _APPEND_BATCH // per_stream)):
                if written >= events:
                    break
                count = min(per_stream, events - written)
                group.append(StreamEvents(
                    f"acct-{stream}",
                    [Deposited(amount=(written + i) % 100) for i in range(count)],
                    NO_STREAM,
                ))
                written += count
                stream += 1
            store.append_streams(group)
        return store.head()


def _expected_totals(events: int, per_stream: int) -> dict[str, tuple[int, int, int]]:
    totals: dict[str, tuple[int, int, int]] = {}
    for i in range(events):
        stream = f"acct-{i // per_stream}"
        count, amount, _ = totals.get(stream, (0, 0, 0))
        totals[stream] = (count + 1, amount + i % 100, i + 1)
    return totals


def run(events: int, per_stream: int, batch_events: int, jdbc_jar: Path | None) -> Report:
    """Run the whole benchmark on throwaway services; see the module docstring."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from lakefold.local import LocalPostgres
    from lakefold.spark import (
        DeltaTarget,
        WriteMode,
        read_delta,
        register_sources,
        spark_session,
        write_batch,
    )
    from lakefold.spark._events_copy import store_log_select
    from lakefold.spark._positions import ReadOptions, split_range

    jar = find_jdbc_jar(jdbc_jar)
    report = Report("replay", {"events": events, "per_stream": per_stream,
                               "batch_events": batch_events, "jdbc_jar": jar.name})
    scratch = Path(tempfile.mkdtemp(prefix="lakefold-bench-replay-"))
    try:
        with LocalPostgres(durable=True) as server:
            server.start()
            dsn = server.dsn()
            started = time.perf_counter()
            head = load_events(dsn, events, per_stream)
            report.params["load_events_per_s"] = round(events / (time.perf_counter() - started))
            if head != events:
                raise LakefoldError(f"loaded {events} events but the store's head is {head}")
            import psycopg
            from psycopg import sql

            with psycopg.connect(dsn, autocommit=True) as conn:
                # What autovacuum would do soon after a bulk load.
                conn.execute("ANALYZE")
                # The JDBC baseline reads the same rows from a flat copy with an indexed
                # position column, so that its partition ranges are index range scans: an
                # easier job than the store's own tables give the lakefold source.
                conn.execute(sql.SQL("CREATE TABLE {} AS {}").format(
                    sql.Identifier(_FLAT_TABLE), store_log_select(conn, 1, head + 1)))
                conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (position)").format(
                    sql.Identifier(_FLAT_TABLE)))
                conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(_FLAT_TABLE)))
            spark = spark_session(conf={"spark.jars": str(jar),
                                        "spark.sql.shuffle.partitions": "4"},
                                  app_name="lakefold-bench-replay")
            try:
                register_sources(spark)
                partitions = len(split_range(1, head + 1, ReadOptions()))
                report.params["partitions"] = partitions

                def timed_noop(frame: DataFrame) -> float:
                    began = time.perf_counter()
                    frame.write.format("noop").mode("overwrite").save()
                    return time.perf_counter() - began

                source = spark.read.format("lakefold_events").option("dsn", dsn).load()
                timed_noop(source.limit(10))  # warm up the Python workers and the JVM
                report.results["read_events_per_s"] = events / timed_noop(source)

                from psycopg.conninfo import conninfo_to_dict

                params = conninfo_to_dict(dsn)
                url = (f"jdbc:postgresql://{params.get('host', '127.0.0.1')}:"
                       f"{params.get('port', 5432)}/{params.get('dbname', 'postgres')}")
                jdbc = spark.read.jdbc(
                    url, _FLAT_TABLE,
                    column="position", lowerBound=1, upperBound=head + 1,
                    numPartitions=partitions,
                    properties={"user": str(params.get("user", "postgres")),
                                "password": str(params.get("password", "")),
                                "driver": "org.postgresql.Driver", "fetchsize": "10000"},
                )
                report.baseline["jdbc_read_events_per_s"] = events / timed_noop(jdbc)

                target = DeltaTarget(str(scratch / "totals"), mode=WriteMode.UPSERT,
                                     app_id="bench-totals@1", keys=("stream_id",))

                def fold(batch: DataFrame, batch_id: int) -> None:
                    counted = batch.groupBy("stream_id").agg(
                        F.count("*").alias("n"), F.sum("data.amount").alias("a"),
                        F.max("position").alias("last_position"))
                    if Path(target.path, "_delta_log").exists():
                        before = read_delta(spark, target.path).select(
                            "stream_id", F.col("events").alias("n0"),
                            F.col("amount").alias("a0"))
                        counted = counted.join(before, "stream_id", "left")
                    else:
                        counted = counted.withColumn("n0", F.lit(0)).withColumn("a0", F.lit(0))
                    totals = counted.select(
                        "stream_id",
                        (F.col("n") + F.coalesce("n0", F.lit(0))).alias("events"),
                        (F.col("a") + F.coalesce("a0", F.lit(0))).alias("amount"),
                        "last_position")
                    write_batch(totals, target, batch_id)

                began = time.perf_counter()
                query = (
                    spark.readStream.format("lakefold_events").option("dsn", dsn)
                    .option("registry", REGISTRY_PATH)
                    .option("maxRecordsPerTrigger", str(batch_events)).load()
                    .writeStream.foreachBatch(fold)
                    .option("checkpointLocation", str(scratch / "checkpoint"))
                    .trigger(availableNow=True).start()
                )
                query.awaitTermination()
                report.results["replay_events_per_s"] = events / (time.perf_counter() - began)
                from deltalake import DeltaTable

                got = {r["stream_id"]: (r["events"], r["amount"], r["last_position"])
                       for r in DeltaTable(target.path).to_pyarrow_table().to_pylist()}
                if got != _expected_totals(events, per_stream):
                    raise LakefoldError("the replayed Delta aggregate differs from the expected "
                                        "totals; the benchmark's result is invalid")
            finally:
                spark.stop()
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
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Event store → Spark read and Delta replay throughput vs spark.read.jdbc."""
    if events < 1 or per_stream < 1 or batch_events < 1:
        raise LakefoldError("--events, --per-stream and --batch-events must be at least 1")
    run(events, per_stream, batch_events, jdbc_jar).emit(as_json=as_json)
