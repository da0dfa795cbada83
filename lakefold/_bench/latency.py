"""``lakefold bench latency``: from a commit in the source database to visible in Delta, in
Redis and in the search index, at a steady rate of changes.

Set-up (all throwaway: PostgreSQL with fsync on, Redis, a local Spark session): a
``customers`` table of ``--rows`` rows is captured into the changelog, and three projections of
it run in one runner: a Delta upsert, a Redis cache and a Tantivy index, with processing-time
triggers of ``--trigger`` (Redis, search) and ``DELTA_TRIGGER`` (Delta). As in a deployment,
the capture (``lakefold capture run``), the runner (``lakefold run``, this process) and the
application that writes and reads (the load and the pollers below) are three processes, so
none of them waits for another's Python interpreter lock.

Load: one writer commits ``--rate`` row updates per second to random customers, as one
transaction of ``rate/100`` updates every 10 ms.
Probes: ``--probes`` times per second the writer instead renames customer 0 to
``probe-<n>`` and notes the commit time; one poller per target watches customer 0 and, when it
sees ``probe-<n>``, records the latency of every probe up to ``n`` that it had not seen yet.
The first ``--warmup`` seconds are not counted.

Baseline (same run): the same probes seen in the changelog store itself (capture latency),
i.e. the floor under every target.
"""

from __future__ import annotations

import multiprocessing
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack, closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lakefold._bench import bench_app
from lakefold._bench.report import BenchmarkError, Report

if TYPE_CHECKING:
    from lakefold.capture import CaptureConfig

_TABLE = "public.customers"
#: The Delta projection's trigger, seconds (``--trigger`` when that is longer). Every Delta
#: micro-batch is a merge, a commit and a new file; a Delta upsert every 50 ms is not how a
#: table is kept (small files, a commit log that grows 20 entries a second), and its 3 s
#: target leaves room for batches a second apart. Redis and search run at ``--trigger``.
DELTA_TRIGGER = 1.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


class _Probes:
    """Commit times of probes, and the latency each target saw them with."""

    def __init__(self, warmup_until: float) -> None:
        self.committed: dict[int, float] = {}
        self.seen: dict[str, dict[int, float]] = {}
        self.warmup_until = warmup_until
        self.lock = threading.Lock()

    def commit(self, number: int, at: float) -> None:
        with self.lock:
            self.committed[number] = at

    def observe(self, target: str, number: int, at: float) -> None:
        with self.lock:
            seen = self.seen.setdefault(target, {})
            for probe, committed in self.committed.items():
                if probe <= number and probe not in seen:
                    seen[probe] = (at - committed) * 1000.0

    def latencies(self, target: str) -> list[float]:
        with self.lock:
            return [ms for probe, ms in self.seen.get(target, {}).items()
                    if self.committed[probe] >= self.warmup_until]


def _probe_number(name: object) -> int | None:
    if isinstance(name, str) and name.startswith("probe-"):
        return int(name.removeprefix("probe-"))
    return None


def _poll(target: str, read: Callable[[], object], probes: _Probes, stop: threading.Event,
          interval: float) -> None:
    while not stop.is_set():
        try:
            number = _probe_number(read())
        except Exception:
            number = None
        if number is not None:
            probes.observe(target, number, time.perf_counter())
        time.sleep(interval)


def _batch_phases(runner: Any) -> dict[str, dict[str, float]]:
    """Per query, the median duration of each micro-batch phase over its recent batches
    (Spark's progress: triggerExecution, latestOffset, walCommit, addBatch, commitOffsets,
    ...): where the time between a change and its visibility goes."""
    phases: dict[str, dict[str, float]] = {}
    for query in list(runner.queries.values()):
        if query.query is None:
            continue
        progress = [p for p in query.query.recentProgress if p.numInputRows > 0]
        names = {name for p in progress for name in p.durationMs}
        phases[query.projection.name] = {
            name: round(statistics.median(p.durationMs.get(name, 0) for p in progress), 1)
            for name in sorted(names)}
    return phases


def _view(customers: Any) -> Any:
    """What every target keeps of a customer (the same transform for all three)."""
    return customers.select("id", "name", "email", "city", "_position", "_deleted")


def _projections(trigger: float) -> Any:
    """The three projections of the customers table: Redis and search at ``trigger``, Delta
    at ``DELTA_TRIGGER`` or ``trigger``, whichever is longer."""
    from lakefold.projections import (
        ProjectionOptions,
        Registry,
        changelog,
        delta_table,
        projection,
        redis_cache,
        search_index,
    )
    from lakefold.projections.operations import registering_into

    registry = Registry()
    options = ProjectionOptions(trigger_seconds=trigger, max_records_per_batch=50_000)
    delta_options = replace(options, trigger_seconds=max(trigger, DELTA_TRIGGER))
    with registering_into(registry):
        projection("customers_delta", sources=[changelog(_TABLE)],
                   target=delta_table("upsert", keys=["id"]), options=delta_options)(_view)
        projection("customers_cache", sources=[changelog(_TABLE)],
                   target=redis_cache(key="id"), options=options)(_view)
        projection("customers_search", sources=[changelog(_TABLE)],
                   target=search_index(key="id", text=["name", "city"]), options=options)(_view)
    return registry


@dataclass(frozen=True)
class _Workload:
    """What the application process writes and watches."""

    dsn: str
    redis_url: str
    seconds: float
    rate: int
    rows: int
    probes_per_s: float
    warmup: float


def _capture_main(config: CaptureConfig, stop: Any) -> None:
    """The capture process: captures until ``stop`` (a multiprocessing Event) is set."""
    from lakefold.capture import Capture

    local = threading.Event()

    def relay() -> None:
        stop.wait()
        local.set()

    threading.Thread(target=relay, daemon=True).start()
    Capture(config).run(stop=local)


def _readers(work: _Workload, stack: ExitStack) -> dict[str, Callable[[], object]]:
    """Per target, a function returning customer 0's name as that target shows it now."""
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    from lakefold.capture import ChangelogStore
    from lakefold.projections import RedisCacheReader, SearchIndexReader
    from lakefold.projections.operations import Catalog

    catalog = stack.enter_context(closing(Catalog(work.dsn)))
    cache = stack.enter_context(closing(RedisCacheReader(work.redis_url, pointer_ttl=60)))
    search = SearchIndexReader(lambda view: catalog.current(view).location("search"),
                               pointer_ttl=60)
    log_store = stack.enter_context(ChangelogStore(work.dsn))
    delta_path = catalog.current("customers_delta").location("delta")
    table: list[DeltaTable] = []
    last_seen = [0]

    def read_delta() -> object:
        if not table:
            table.append(DeltaTable(delta_path))
        else:
            table[0].update_incremental()
        found = table[0].to_pyarrow_dataset().to_table(
            filter=ds.field("id") == 0, columns=["name"]).column("name").to_pylist()
        return found[0] if found else None

    def read_redis() -> object:
        return (cache.get("customers_cache", 0) or {}).get("name")

    def read_search() -> object:
        return (search.get("customers_search", 0) or {}).get("name")

    def read_changelog() -> object:
        batch = log_store.read(_TABLE, from_position=last_seen[0] + 1, limit=100_000)
        if batch.num_rows == 0:
            return None
        last_seen[0] = batch.column("_position")[-1].as_py()
        names = [n for n, i in zip(batch.column("name").to_pylist(),
                                   batch.column("id").to_pylist(), strict=True)
                 if i == 0 and isinstance(n, str) and n.startswith("probe-")]
        return names[-1] if names else None

    return {"delta": read_delta, "redis": read_redis, "search": read_search,
            "changelog": read_changelog}


def _application_main(work: _Workload) -> dict[str, Any]:
    """The application process: waits until every view holds the initial rows, then commits
    the load with its probes while one poller per target watches customer 0; returns the
    achieved rate, the probe count and each target's latencies (ms)."""
    import random

    import psycopg

    stop = threading.Event()
    with ExitStack() as stack:
        readers = _readers(work, stack)

        def ready(reader: Callable[[], object]) -> bool:
            try:
                return reader() == "name 0"
            except Exception:
                return False

        deadline = time.monotonic() + 300
        while not all(ready(readers[name]) for name in ("delta", "redis", "search")):
            if time.monotonic() > deadline:
                raise BenchmarkError("the projections did not catch up within 300 s")
            time.sleep(0.2)
        began = time.perf_counter()
        probes = _Probes(warmup_until=began + work.warmup)
        # Poll intervals bound each figure's resolution; they are kept coarse enough that
        # the pollers do not take the 2 cores away from what they measure.
        pollers = [threading.Thread(target=_poll, args=(name, readers[name], probes, stop,
                                                        interval), daemon=True)
                   for name, interval in (("delta", 0.05), ("redis", 0.01), ("search", 0.02),
                                          ("changelog", 0.02))]
        for poller in pollers:
            poller.start()
        rng = random.Random(42)  # noqa: S311 - a reproducible workload, not secrets
        changes = 0
        probe = 0
        next_probe = began
        tick = 0.01  # one transaction of rate/100 updates every 10 ms
        per_tick = max(1, round(work.rate * tick))
        cities = ["Oslo", "Lyon", "Porto", "Turku"]
        with psycopg.connect(work.dsn, autocommit=True) as conn:
            end = began + work.warmup + work.seconds
            ticks = 0
            while (now := time.perf_counter()) < end:
                if now >= next_probe:
                    probe += 1
                    conn.execute("UPDATE customers SET name = %s WHERE id = 0",
                                 (f"probe-{probe}",))
                    probes.commit(probe, time.perf_counter())
                    changes += 1
                    next_probe += 1.0 / work.probes_per_s
                with conn.transaction(), conn.cursor() as cursor:
                    cursor.executemany(
                        "UPDATE customers SET city = %s WHERE id = %s",
                        [(rng.choice(cities), rng.randrange(1, work.rows))
                         for _ in range(per_tick)])
                changes += per_tick
                ticks += 1
                pause = began + ticks * tick - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
            elapsed = time.perf_counter() - began
        time.sleep(3)  # let the last probes arrive
        stop.set()
        for poller in pollers:
            poller.join(timeout=10)
    return {"achieved_rate": round(changes / elapsed), "probes": probe,
            "latencies": {name: probes.latencies(name) for name in readers}}


def run(seconds: float, rate: int, rows: int, probes_per_s: float, warmup: float,
        trigger: float) -> Report:
    """Run the benchmark on throwaway services; see the module docstring."""
    import psycopg

    from lakefold.capture import Capture, CaptureConfig, ChangelogStore
    from lakefold.local import LocalPostgres, LocalRedis
    from lakefold.projections import Runner, RunnerConfig
    from lakefold.projections.operations import RUNNER_SPARK_CONF, SinkRoots
    from lakefold.spark import spark_session

    report = Report("latency", {"seconds": seconds, "rate": rate, "rows": rows,
                                "probes_per_s": probes_per_s, "warmup_s": warmup,
                                "trigger_s": trigger,
                                "delta_trigger_s": max(trigger, DELTA_TRIGGER)})
    scratch = Path(tempfile.mkdtemp(prefix="lakefold-bench-latency-"))
    spawn = multiprocessing.get_context("spawn")
    capture_stop = spawn.Event()
    stop = threading.Event()
    try:
        with LocalPostgres(durable=True) as server, LocalRedis() as redis_server:
            server.start()
            redis_server.start()
            dsn = server.dsn()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE customers (id bigint PRIMARY KEY, name text, "
                             "email text, city text)")
            capture_config = CaptureConfig(source_dsn=dsn, store_dsn=dsn, slot="bench_latency",
                                           publication="bench_latency", tables=(_TABLE,))
            Capture(capture_config).setup()
            with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cursor:
                with cursor.copy("COPY customers FROM STDIN") as copy:
                    for i in range(rows):
                        copy.write_row((i, f"name {i}", f"c{i}@example.com", "Oslo"))
            capture = spawn.Process(target=_capture_main, args=(capture_config, capture_stop),
                                    daemon=True)
            capture.start()
            spark = spark_session("local[2]", conf={**RUNNER_SPARK_CONF,
                                                    "spark.sql.shuffle.partitions": "2"},
                                  app_name="lakefold-bench-latency")
            deadline = time.monotonic() + 120
            while True:  # the runner validates its sources: wait for the stream to exist
                with ChangelogStore(dsn) as store:
                    if any(s.name == _TABLE and s.head >= rows for s in store.streams()):
                        break
                if time.monotonic() > deadline or not capture.is_alive():
                    raise BenchmarkError("capture did not deliver the initial rows in 120 s")
                time.sleep(0.1)
            runner = Runner(spark, _projections(trigger), RunnerConfig(
                store_dsn=dsn, roots=SinkRoots.under(scratch), redis_url=redis_server.url,
                poll_seconds=0.2))
            runner.prepare()
            run_thread = threading.Thread(target=runner.run, kwargs={"stop": stop},
                                          daemon=True)
            run_thread.start()
            workload = _Workload(dsn, redis_server.url, seconds, rate, rows, probes_per_s,
                                 warmup)
            with ProcessPoolExecutor(1, mp_context=spawn) as application:
                outcome = application.submit(_application_main, workload).result()
            report.params["achieved_rate"] = outcome["achieved_rate"]
            report.params["probes"] = outcome["probes"]
            latencies: dict[str, list[float]] = outcome["latencies"]
            for name in ("delta", "redis", "search"):
                values = latencies[name]
                report.results[f"{name}_p50_ms"] = round(_percentile(values, 0.50), 1)
                report.results[f"{name}_p99_ms"] = round(_percentile(values, 0.99), 1)
                report.params[f"{name}_samples"] = len(values)
                report.params[f"{name}_mean_ms"] = round(statistics.fmean(values), 1) \
                    if values else None
            base = latencies["changelog"]
            report.baseline["changelog_p50_ms"] = round(_percentile(base, 0.50), 1)
            report.baseline["changelog_p99_ms"] = round(_percentile(base, 0.99), 1)
            report.params["batch_phases_p50_ms"] = _batch_phases(runner)
            stop.set()
            run_thread.join(timeout=60)
            runner.close()
            capture_stop.set()
            capture.join(timeout=60)
    finally:
        stop.set()
        capture_stop.set()
        shutil.rmtree(scratch, ignore_errors=True)
    return report


@bench_app.command("latency")
def latency(
    seconds: Annotated[float, typer.Option(help="Measured seconds (after the warm-up).")] = 60,
    rate: Annotated[int, typer.Option(help="Changes per second committed to the source.")]
    = 1_000,
    rows: Annotated[int, typer.Option(help="Rows in the source table.")] = 10_000,
    probes: Annotated[float, typer.Option(help="Probes per second.")] = 10.0,
    warmup: Annotated[float, typer.Option(help="Seconds not counted at the start.")] = 5.0,
    trigger: Annotated[float, typer.Option(
        help="Processing-time trigger of the Redis and search projections, seconds (Delta's "
             "is at least 1 s).")] = 0.05,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Commit-to-visible latency in Delta, Redis and the search index (p50, p99)."""
    if seconds <= 0 or rate <= 0 or rows < 2 or probes <= 0 or warmup < 0 or trigger < 0:
        raise BenchmarkError("need --seconds > 0, --rate > 0, --rows >= 2, --probes > 0, "
                            "--warmup >= 0 and --trigger >= 0")
    run(seconds, rate, rows, probes, warmup, trigger).emit(as_json=as_json)
