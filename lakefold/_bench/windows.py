"""``lakefold bench windows``: a windowed view over event time (1-minute tumbling windows by
device, late events correcting their windows), against plain Spark Structured Streaming's
``withWatermark`` + ``window`` over the same events, same run.

Set-up (throwaway PostgreSQL with fsync on, local Spark): ``--events`` ``sensor.read`` events
(``{"device": "d<k>", "occurred_at": ...}``, ``--devices`` devices) with event times spread
over one day, appended through ``EventStore.append_streams`` (the bulk path the other benches
load with; one stream of ``APPEND`` events per call, so the log's order is the generated
order). 5 % of the events are out of order by 1 to 100 s (within the allowed lateness of 2
minutes: they count in their windows), 0.5 % are behind the largest earlier event time by
more than the lateness plus a window (their window has closed: lakefold lists them in
``lakefold.late_events``). The view, ``readings_per_minute``: ``count(*)`` per
(``window_start``, ``device``) over ``tumbling("readings.occurred_at", "1 minute",
lateness="2 minutes")``, upserted into Delta.

- ``results.events_per_s``: a ``Runner`` started over the loaded events, until caught up (the
  Delta target written): events / seconds from the runner's creation.
- ``results.late_correction_p50_ms`` / ``late_correction_p99_ms``: then, with the runner
  running in the background, ``--probes`` events are appended one at a time, each 90 s behind
  the largest event time (late, within the lateness), in a window whose row is already in the
  target; the time from the append's return to the corrected count read from the Delta table
  (polled every ``POLL_SECONDS``; the runner polls the store every 0.05 s).
- ``results.events_lost``: appended events - the counts summed over the Delta target - the
  late pairs in ``lakefold.late_events`` - the view's dead letters (must be 0; the run fails
  otherwise). The target is also compared row by row with the counts computed from the
  generated events, and the late events with the generated late ones.
- ``baseline.spark_watermark_events_per_s``: the same aggregation in Spark Structured
  Streaming: ``withWatermark("occurred_at", "2 minutes")``, ``groupBy(window(occurred_at,
  "1 minute"), device).count()``, append mode into a Parquet file sink, reading the same
  events in the same order from Parquet files of ``--file-events`` events each (written
  before the clock starts, modification times in order) with ``maxFilesPerTrigger=1`` and an
  ``availableNow`` trigger: events / seconds from ``start()`` to the query's end.
  ``baseline.spark_rows_dropped``: ``numRowsDroppedByWatermark`` summed over the query's
  progress (rows reaching the stateful operator, after Spark's partial aggregation, so not
  events one for one); ``baseline.spark_events_lost``: the events of the windows Spark emitted
  (end at or before the last window it emitted) that are missing from its counts.
- ``results.ratio``: lakefold's events/s over Spark's; ``params.target``: the issue's target
  (at least 0.5 times Spark's throughput, 0 events lost).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from pydantic import BaseModel

from lakefold._bench import bench_app
from lakefold._bench._background import BackgroundRunner
from lakefold._bench.latency import _percentile
from lakefold._bench.report import BenchmarkError, Report
from lakefold.schemas import EventRegistry

registry = EventRegistry()


@registry.event("sensor.read")
class Reading(BaseModel):
    """The benchmark's one event type."""

    device: str
    occurred_at: datetime


NAME = "readings_per_minute"
CATEGORY = "sensor"
QUERY = ("SELECT window_start, window_end, device, count(*) AS events "
         "FROM readings GROUP BY window_start, window_end, device")
APPEND = 10_000  # events per append_streams call (one stream each: the log keeps their order)
MINUTE_US = 60_000_000
LATENESS_US = 2 * MINUTE_US
DAY_US = 86_400_000_000
START = datetime(2026, 11, 26, tzinfo=UTC)
OUT_OF_ORDER = 0.05
TOO_LATE = 0.005
PROBE_BEHIND_US = 90_000_000  # a probe's time behind the largest event time (< lateness)
POLL_SECONDS = 0.02  # the probe's poll of the Delta table (more often steals the runner's CPU)
TARGET = "results.ratio >= 0.5 and results.events_lost == 0"


@dataclass(frozen=True)
class _Shape:
    events: int
    devices: int
    probes: int
    file_events: int


@dataclass(frozen=True)
class _Events:
    """The generated events, in log order: event times (µs since the epoch), device numbers,
    and which are late beyond the lateness (by construction, see ``generate``)."""

    times: np.ndarray
    devices: np.ndarray
    late: np.ndarray

    def expected(self) -> Counter[tuple[int, int]]:
        """(window start µs, device) → count, of the events not late."""
        keep = ~self.late
        starts = self.times[keep] // MINUTE_US * MINUTE_US
        return Counter(zip(starts.tolist(), self.devices[keep].tolist(), strict=True))


def generate(events: int, devices: int, seed: int = 7) -> _Events:
    """Event times over a day in log order: most at their place, ``OUT_OF_ORDER`` 1 to 100 s
    behind it (never late: the lateness is 120 s), ``TOO_LATE`` behind the largest earlier
    event time by the lateness plus 1 to 11 minutes (always late: their window ends before the
    watermark). The first ten events are in order."""
    rng = np.random.default_rng(seed)
    base = START.timestamp() * 1_000_000 + np.arange(events, dtype=np.int64) * (
        DAY_US // max(events, 1))
    base = base.astype(np.int64)
    kind = rng.random(events)
    kind[:10] = 1.0
    times = base.copy()
    ooo = kind < OUT_OF_ORDER
    times[ooo] -= rng.integers(1_000_000, 100_000_000, int(ooo.sum()))
    late = (kind >= OUT_OF_ORDER) & (kind < OUT_OF_ORDER + TOO_LATE)
    # the largest time before each event (late ones, below it, never raise it)
    running = np.maximum.accumulate(np.where(late, np.iinfo(np.int64).min, times))
    before = np.concatenate([[running[0]], running[:-1]])
    times[late] = before[late] - LATENESS_US - MINUTE_US - rng.integers(
        1_000_000, 600_000_000, int(late.sum()))
    return _Events(times, rng.integers(0, devices, events), late)


def _iso(micros: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)).isoformat()


def _load(dsn: str, generated: _Events) -> None:
    from lakefold.eventstore import NO_STREAM, EventStore, StreamEvents
    from lakefold.schemas import NewEvent

    with EventStore(dsn) as store:
        store.install()
        times, devices = generated.times.tolist(), generated.devices.tolist()
        for start in range(0, len(times), APPEND):
            batch = [NewEvent("sensor.read", {"device": f"d{d}", "occurred_at": _iso(t)})
                     for t, d in zip(times[start:start + APPEND],
                                     devices[start:start + APPEND], strict=True)]
            store.append_streams([StreamEvents(f"{CATEGORY}-{start // APPEND}", batch,
                                               NO_STREAM)])
        if store.head() != len(times):
            raise BenchmarkError(f"the store holds {store.head()} events, not {len(times)}")


def _registry() -> Any:
    from lakefold.projections import Registry, delta_table, events, tumbling, view
    from lakefold.projections.operations import registering_into

    views = Registry()
    key = ["window_start", "device"]
    with registering_into(views):
        view(NAME, inputs={"readings": events(CATEGORY, types=["sensor.read"])}, key=key,
             query=QUERY, target=delta_table("upsert", keys=key), registry=registry,
             window=tumbling("readings.occurred_at", "1 minute", lateness="2 minutes"))
    return views


def _target(path: str) -> dict[tuple[int, int], int]:
    """The Delta target's rows: (window start µs, device number) → count."""
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table(columns=["window_start", "device", "events"])
    starts = table.column("window_start").cast("int64").to_pylist()
    devices = [int(d[1:]) for d in table.column("device").to_pylist()]
    return dict(zip(zip(starts, devices, strict=True), table.column("events").to_pylist(),
                    strict=True))


def _count_at(table: Any, start: int, device: int) -> int:
    """The count of (window ``start``, ``device``) in the Delta table (0: no row)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    table.update_incremental()
    moment = pa.scalar(start, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    # by the window only: the files of later commits may hold the device as string_view,
    # which pyarrow does not compare with a string
    rows = table.to_pyarrow_dataset().to_table(
        columns=["device", "events"], filter=ds.field("window_start") == moment).to_pylist()
    return next((int(r["events"]) for r in rows if str(r["device"]) == f"d{device}"), 0)


def _probe(path: str, store: Any, background: BackgroundRunner, generated: _Events,
           probes: int) -> list[float]:
    """Append ``probes`` late-but-within-lateness events one at a time, each to a device
    whose row of the window is in the target already (if it has any); the ms from each
    append to its window's corrected count in the Delta target."""
    from deltalake import DeltaTable

    from lakefold.schemas import NewEvent

    table = DeltaTable(path)
    moment = int(generated.times.max()) - PROBE_BEHIND_US
    start = moment // MINUTE_US * MINUTE_US
    present = sorted(d for s, d in generated.expected() if s == start) or [0]
    latencies = []
    for n in range(probes):
        device = present[n % len(present)]
        before = _count_at(table, start, device)
        store.append(f"{CATEGORY}-probe", [NewEvent("sensor.read", {
            "device": f"d{device}", "occurred_at": _iso(moment)})])
        sent = time.perf_counter()
        deadline = sent + 60
        while _count_at(table, start, device) != before + 1:
            background.check("under the probes")
            if time.perf_counter() > deadline:
                raise BenchmarkError(f"probe {n}: its window was not corrected within 60 s")
            time.sleep(POLL_SECONDS)
        latencies.append((time.perf_counter() - sent) * 1000)
    return latencies


def _lakefold(report: Report, spark: Any, dsn: str, scratch: Path, generated: _Events,
              shape: _Shape) -> None:
    import psycopg

    from lakefold.eventstore import EventStore
    from lakefold.projections import Runner, RunnerConfig
    from lakefold.projections.operations import Catalog, SinkRoots

    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(scratch / "lakefold"),
                          poll_seconds=0.05)
    report.params["runner_poll_seconds"] = config.poll_seconds
    began = time.perf_counter()
    runner = Runner(spark, _registry(), config)
    try:
        runner.run(until_caught_up=True, timeout=6 * 3600)
        elapsed = time.perf_counter() - began
        with Catalog(dsn) as catalog:
            path = catalog.current(NAME).location("delta")
        expected = generated.expected()
        if _target(path) != dict(expected):
            raise BenchmarkError("the view's Delta target differs from the counts of the "
                                 "generated events that are not late")
        report.results["events_per_s"] = round(shape.events / elapsed)
        background = BackgroundRunner(runner)
        try:
            with EventStore(dsn) as store:
                latencies = _probe(path, store, background, generated, shape.probes)
        finally:
            background.close(timeout=120)
        if background.failure is not None:
            raise BenchmarkError("the runner failed under the probes") from background.failure
    finally:
        runner.close()
    report.results["late_correction_p50_ms"] = round(_percentile(latencies, 0.50), 1)
    report.results["late_correction_p99_ms"] = round(_percentile(latencies, 0.99), 1)
    appended = shape.events + shape.probes
    counted = sum(_target(path).values())
    with psycopg.connect(dsn, autocommit=True) as conn:
        late = conn.execute("SELECT position FROM lakefold.late_events WHERE view = %s",
                            (NAME,)).fetchall()
        row = conn.execute("SELECT count(*) FROM lakefold.projection_dead_letters "
                           "WHERE name = %s", (NAME,)).fetchone()
    dead = int(row[0]) if row else 0
    lost = appended - counted - len(late) - dead
    report.results["events_lost"] = lost
    report.results["late_events_listed"] = len(late)
    report.params["late_events_generated"] = int(generated.late.sum())
    report.params["dead_letters"] = dead
    if lost != 0:
        raise BenchmarkError(f"{lost} events are neither counted in a window nor listed as "
                             "late nor dead-lettered")
    if sorted(p for (p,) in late) != (np.nonzero(generated.late)[0] + 1).tolist():
        raise BenchmarkError("the late events listed are not the generated late ones")


def _spark_files(folder: Path, generated: _Events, per_file: int) -> None:
    """The events as Parquet files of ``per_file`` events, modification times in log order
    (the file source reads the oldest first)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True)
    times = pa.array(generated.times, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    devices = pa.array([f"d{d}" for d in generated.devices.tolist()], pa.string())
    first = int(time.time()) - len(generated.times) // per_file - 10
    for n, start in enumerate(range(0, len(times), per_file)):
        path = folder / f"part-{n:06d}.parquet"
        pq.write_table(pa.table({"device": devices[start:start + per_file],
                                 "occurred_at": times[start:start + per_file]}), path)
        os.utime(path, (first + n, first + n))


def _spark(report: Report, spark: Any, scratch: Path, generated: _Events,
           shape: _Shape) -> None:
    import pyarrow as pa
    import pyarrow.dataset as ds
    from pyspark.sql import functions as F

    folder = scratch / "spark-in"
    _spark_files(folder, generated, shape.file_events)
    counts = (spark.readStream.schema("device STRING, occurred_at TIMESTAMP")
              .option("maxFilesPerTrigger", 1).parquet(str(folder))
              .withWatermark("occurred_at", "2 minutes")
              .groupBy(F.window("occurred_at", "1 minute"), "device").count())
    out = scratch / "spark-out"
    began = time.perf_counter()
    query = (counts.writeStream.outputMode("append").format("parquet")
             .option("path", str(out))
             .option("checkpointLocation", str(scratch / "spark-checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - began
    dropped = 0
    batches = 0
    for progress in query.recentProgress:
        batches += 1
        for operator in progress.stateOperators:
            dropped += int(operator.numRowsDroppedByWatermark)
    report.baseline["spark_watermark_events_per_s"] = round(shape.events / elapsed)
    report.baseline["spark_rows_dropped"] = dropped
    report.params["spark_batches"] = batches
    emitted = ds.dataset(str(out), format="parquet").to_table()
    if emitted.num_rows:
        ends = emitted.column("window").combine_chunks().field("end")  # INT96: ns
        ends = ends.cast(pa.timestamp("us", tz=ends.type.tz)).cast(pa.int64())
        last_end = int(max(ends.to_pylist()))
        windows_end = generated.times // MINUTE_US * MINUTE_US + MINUTE_US
        due = int((windows_end <= last_end).sum())
        report.baseline["spark_events_lost"] = due - int(sum(
            emitted.column("count").to_pylist()))
    else:
        report.baseline["spark_events_lost"] = 0


def run(shape: _Shape) -> Report:
    """Run the benchmark on throwaway services; see the module docstring."""
    from lakefold.local import LocalPostgres
    from lakefold.projections.operations import RUNNER_SPARK_CONF
    from lakefold.spark import spark_session

    report = Report("windows", {"events": shape.events, "devices": shape.devices,
                                "probes": shape.probes, "file_events": shape.file_events,
                                "window": "1 minute", "lateness": "2 minutes",
                                "out_of_order": OUT_OF_ORDER, "too_late": TOO_LATE,
                                "target": TARGET})
    scratch = Path(tempfile.mkdtemp(prefix="lakefold-bench-windows-"))
    generated = generate(shape.events, shape.devices)
    try:
        with LocalPostgres(durable=True) as server:
            server.start()
            dsn = server.dsn()
            began = time.perf_counter()
            _load(dsn, generated)
            report.params["load_events_per_s"] = round(
                shape.events / (time.perf_counter() - began))
            spark = spark_session("local[2]", conf={
                **RUNNER_SPARK_CONF, "spark.sql.shuffle.partitions": "2",
                "spark.sql.streaming.numRecentProgressUpdates": "1000000"},
                app_name="lakefold-bench-windows")
            _lakefold(report, spark, dsn, scratch, generated, shape)
            _spark(report, spark, scratch, generated, shape)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report.results["ratio"] = round(report.results["events_per_s"]
                                    / report.baseline["spark_watermark_events_per_s"], 3)
    return report


@bench_app.command("windows")
def windows(
    events: Annotated[int, typer.Option(help="Events over one day of event time.")]
    = 10_000_000,
    devices: Annotated[int, typer.Option("--keys", "--devices",
                                         help="Distinct grouping keys (devices).")] = 1_000,
    probes: Annotated[int, typer.Option(help="Late events appended one at a time for the "
                                             "correction latency.")] = 50,
    file_events: Annotated[int, typer.Option(help="Events per Parquet file (one Spark "
                                                  "micro-batch each).")] = APPEND,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """A windowed view over event time (1-minute tumbling windows, late events corrected or
    listed): events/s and late-correction latency, against Spark's withWatermark."""
    if events < 1_000 or devices < 1 or probes < 1 or file_events < 1:
        raise BenchmarkError("need --events >= 1000, --keys >= 1, --probes >= 1 and "
                             "--file-events >= 1")
    run(_Shape(events, devices, probes, file_events)).emit(as_json=as_json)
