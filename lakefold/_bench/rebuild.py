"""``lakefold bench rebuild``: replay a long event history into a new generation of a Delta
aggregate, while the old generation stays live, and switch.

Set-up: the shared bench history (``history.py``: ``--events`` deposits ``{"customer":
"c<k>", "amount": n}`` of ``--customers`` customers, 1,000 events per stream) in a throwaway
PostgreSQL (fsync on) or ``--store-dsn`` (the projection is removed from its catalog first, so
every run builds generation 1 from nothing), local Spark, and one projection,
``sales_by_customer``: a streaming aggregation (sum of amounts and count per customer) upserted
into Delta. A runner runs it in the background, as ``lakefold run`` does.

- ``params.initial_build_events_per_s``: generation 1 built from nothing (runner start to
  caught up, batches of at most ``LIVE_BATCH`` records), for reference;
- ``results.rebuild_events_per_s``: what ``lakefold rebuild NAME`` asks of the running runner:
  generation 2 replays the whole history in batches of ``--batch`` records beside the live
  generation, and the catalog switches to it; events divided by the time from the request to
  the switch. The table is checked against the expected sums.
- ``baseline.batch_aggregate_events_per_s``: the same aggregate as one plain Spark batch job
  over the ``lakefold_events`` source (no streaming, state store, checkpoints or Delta), same
  run, same data: what Spark itself costs.

With ``--master spark://...`` and/or ``--lake s3://BUCKET/PREFIX`` (the store's endpoint and
credentials from the ``LAKEFOLD_S3_*`` settings), the same three figures are measured again,
after the local ones and on the same history, with the driver's jobs on that cluster and the
generations' tables and Spark checkpoints in that bucket: ``results.<where>``,
``baseline.<where>`` and ``params.<where>_initial_build_events_per_s``, ``<where>`` being
``cluster``, ``s3`` or ``cluster+s3`` (``params.master`` and ``params.lake`` say which). The
local figures stay at the top level, so one JSON has both.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from lakefold._bench import bench_app
from lakefold._bench._background import BackgroundRunner
from lakefold._bench._elsewhere import (
    LakeOption,
    MasterOption,
    elsewhere,
    lake_store,
    remove_run_root,
    run_root,
)
from lakefold._bench.history import (
    CATEGORY,
    DEFAULT_CUSTOMERS,
    DEFAULT_PER_STREAM,
    StoreDsnOption,
    history_store,
)
from lakefold._bench.report import BenchmarkError, Report
from lakefold.core.exceptions import LakefoldError


def expected_sums(events: int, customers: int) -> dict[str, tuple[int, int]]:
    sums: dict[str, tuple[int, int]] = {}
    for i in range(events):
        key = f"c{i % customers}"
        amount, count = sums.get(key, (0, 0))
        sums[key] = (amount + i % 100, count + 1)
    return sums


NAME = "sales_by_customer"
#: Records per batch of the live generation (generation 1's build, for reference); the
#: rebuild's batches are ``--batch``. Batches above ``LIVE_READ_MAX`` (both, at the defaults)
#: are read in parallel tasks, not on the driver (``projections.runtime._queries.build``).
LIVE_BATCH = 200_000


def _registry(batch: int) -> Any:
    from pyspark.sql import functions as F

    from lakefold.projections import ProjectionOptions, Registry, delta_table, events, projection
    from lakefold.projections.operations import registering_into

    registry = Registry()
    options = ProjectionOptions(trigger_seconds=0.5, max_records_per_batch=min(batch, LIVE_BATCH),
                                rebuild_records_per_batch=batch, keep_generations=1)
    with registering_into(registry):
        @projection(NAME, sources=[events(CATEGORY)],
                    target=delta_table("upsert", keys=["customer"]), options=options)
        def sales_by_customer(sales: Any) -> Any:
            return (sales
                    .select(F.get_json_object("data", "$.customer").alias("customer"),
                            F.get_json_object("data", "$.amount").cast("long").alias("amount"))
                    .groupBy("customer")
                    .agg(F.sum("amount").alias("amount"), F.count(F.lit(1)).alias("events")))
    return registry


def _build_and_rebuild(results: dict[str, Any], spark: Any, dsn: str, scratch: Path,
                       events: int, batch: int, lake: str | None = None) -> str:
    """Generation 1 from nothing, then a rebuild into generation 2 (in ``lake``, default
    under ``scratch``); the new table's location."""
    from lakefold.projections import Runner, RunnerConfig
    from lakefold.projections.operations import Catalog, SinkRoots

    roots = SinkRoots.under(scratch, lake)
    catalog = Catalog(dsn, roots)  # what a `lakefold rebuild` process opens
    try:
        catalog.install()
        catalog.forget(NAME)  # left by an earlier run on this store; its sinks are gone
        runner = Runner(spark, _registry(batch), RunnerConfig(store_dsn=dsn, roots=roots,
                                                              poll_seconds=0.1))
        began = time.perf_counter()
        background = BackgroundRunner(runner)
        try:
            background.wait(lambda: _caught_up(catalog, events), "generation 1 caught up")
            results["initial_build_events_per_s"] = round(
                events / (time.perf_counter() - began))
            began = time.perf_counter()
            generation = catalog.begin_rebuild(NAME).generation
            background.wait(lambda: catalog.current(NAME).generation == generation,
                            "the switch")
            results["rebuild_events_per_s"] = round(
                events / (time.perf_counter() - began))
        finally:
            background.close()
            runner.close()
        return catalog.current(NAME).location("delta")
    finally:
        catalog.close()


def _caught_up(catalog: Any, events: int) -> bool:
    try:
        return bool(catalog.current(NAME).position.get(CATEGORY, 0) > events)
    except LakefoldError:  # not registered yet: the runner is still preparing
        return False


def _measure(spark: Any, dsn: str, scratch: Path, events: int, customers: int, batch: int,
             lake: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The build, the rebuild (checked) and the batch baseline on ``spark`` with the tables in
    ``lake``: (results, baseline)."""
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    from lakefold.core.object_store import storage_options_for
    from lakefold.spark import register_sources

    results: dict[str, Any] = {}
    path = _build_and_rebuild(results, spark, dsn, scratch, events, batch, lake)
    rows = DeltaTable(path, storage_options=storage_options_for(path)).to_pyarrow_table()
    got = {r["customer"]: (r["amount"], r["events"]) for r in rows.to_pylist()}
    if got != expected_sums(events, customers):
        raise BenchmarkError("the rebuilt aggregate differs from the expected sums")
    register_sources(spark)
    frame = spark.read.format("lakefold_events").option("dsn", dsn).load()
    began = time.perf_counter()
    (frame.select(F.get_json_object("data", "$.customer").alias("customer"),
                  F.get_json_object("data", "$.amount").cast("long").alias("amount"))
     .groupBy("customer").agg(F.sum("amount"), F.count(F.lit(1))).collect())
    return results, {"batch_aggregate_events_per_s": round(
        events / (time.perf_counter() - began))}


def run(events: int, customers: int, batch: int, store_dsn: str | None = None,
        master: str | None = None, lake: str | None = None) -> Report:
    """Run the benchmark on throwaway services; see the module docstring."""
    from lakefold.projections.operations import RUNNER_SPARK_CONF
    from lakefold.spark import spark_session

    report = Report("rebuild", {"events": events, "customers": customers, "batch": batch})
    where = elsewhere(master, lake)
    if where is not None:
        report.params |= {"master": master or "local[*]", "lake": lake or "local disk"}
    store = lake_store(lake)
    conf = {**RUNNER_SPARK_CONF, "spark.sql.shuffle.partitions": "2"}
    scratch = Path(tempfile.mkdtemp(prefix="lakefold-bench-rebuild-"))
    try:
        with history_store(report, events=events, per_stream=DEFAULT_PER_STREAM,
                           customers=customers, store_dsn=store_dsn) as dsn:
            # One driver JVM for both: with --lake, hadoop-aws is on its class path from the
            # start (the local figures' session carries it too, unused).
            spark = spark_session(conf=conf, app_name="lakefold-bench-rebuild",
                                  object_store=store)
            results, baseline = _measure(spark, dsn, scratch / "local", events, customers,
                                         batch, None)
            report.params["initial_build_events_per_s"] = results.pop(
                "initial_build_events_per_s")
            report.results |= results
            report.baseline |= baseline
            if where is not None:
                spark.stop()
                spark = spark_session(master, conf=conf, app_name="lakefold-bench-rebuild",
                                      object_store=store)
                root = run_root(lake, scratch) if lake else None
                try:
                    results, baseline = _measure(spark, dsn, scratch / where, events,
                                                 customers, batch, root)
                finally:
                    spark.stop()
                    if root is not None:
                        remove_run_root(root)
                report.params[f"{where}_initial_build_events_per_s"] = results.pop(
                    "initial_build_events_per_s")
                report.results[where] = results
                report.baseline[where] = baseline
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


@bench_app.command("rebuild")
def rebuild(
    events: Annotated[int, typer.Option(help="Events in the history.")] = 10_000_000,
    customers: Annotated[int, typer.Option(help="Distinct aggregate keys.")] = DEFAULT_CUSTOMERS,
    batch: Annotated[int, typer.Option(help="Records per rebuild micro-batch.")] = 2_000_000,
    store_dsn: StoreDsnOption = None,
    master: MasterOption = None,
    lake: LakeOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Rebuild a Delta aggregate from the whole event history (events/s)."""
    if events < 1 or customers < 1 or batch < 1:
        raise BenchmarkError("need --events >= 1, --customers >= 1 and --batch >= 1")
    run(events, customers, batch, store_dsn, master, lake).emit(as_json=as_json)
