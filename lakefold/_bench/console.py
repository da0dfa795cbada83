"""``lakefold bench console``: 50 API clients polling the console's overview against a live
system, and what that does to a projection's throughput.

Set-up: the shared bench history (``history.py``: ``--events`` events in a throwaway
PostgreSQL, fsync on, or ``--store-dsn``), local Spark, and the rebuild bench's projection
``sales_by_customer`` (a Delta aggregate) kept running by a runner in this process, as
``lakefold run`` does. The console runs as its own process (``lakefold console``, as an
operator would start it), the clients in another (``--clients`` threads, each with its own
keep-alive connection, each asking ``GET /api/overview`` every ``--interval`` s, for at least
``--seconds`` s).

Each of ``--rounds`` rounds rebuilds once without the console and once with it; the figures
are the medians (each round's in ``params.rounds_events_per_s``).

- ``baseline.projection_events_per_s``: a rebuild of ``sales_by_customer`` (the whole history
  replayed into a new generation in batches of ``--batch`` records, then the switch), events
  divided by the time from the request to the switch, without the console;
- ``results.projection_events_per_s``: the same rebuild while the console serves the clients;
  ``results.throughput_effect_pct``: how much slower, in percent (target: at most 5);
- ``results.overview_p50_ms`` / ``overview_p99_ms`` / ``overview_max_ms``: the clients'
  request latencies of the overview (target: p99 at most 200 ms); ``results.requests`` and
  ``results.errors`` (a failed or non-200 request; any makes the run invalid).
"""

from __future__ import annotations

import http.client
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from lakefold._bench import bench_app
from lakefold._bench._background import BackgroundRunner
from lakefold._bench.history import (
    CATEGORY,
    DEFAULT_CUSTOMERS,
    DEFAULT_PER_STREAM,
    StoreDsnOption,
    history_store,
)
from lakefold._bench.rebuild import NAME, _caught_up, _registry
from lakefold._bench.report import BenchmarkError, Report
from lakefold.local import free_port


def poll_overview(port: int, clients: int, interval: float, seconds: float, stop: Any,
                  results: Any) -> None:
    """``clients`` threads polling ``GET /api/overview`` on 127.0.0.1:``port`` for at least
    ``seconds`` and until ``stop`` is set; puts (every successful request's latency in s,
    how many failed) on ``results``. Runs in a process of its own."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[float] = []
        failed = 0
        while time.monotonic() < end or not stop.is_set():
            began = time.perf_counter()
            try:
                conn.request("GET", "/api/overview")
                response = conn.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                ok = False
            took = time.perf_counter() - began
            if ok:
                mine.append(took)
            else:
                failed += 1
            time.sleep(max(0.0, interval - took))
        conn.close()
        with lock:
            latencies.extend(mine)
            errors[0] += failed

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put((latencies, errors[0]))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _rebuild_events_per_s(catalog: Any, background: BackgroundRunner, events: int) -> float:
    """Ask for a rebuild of the running projection; events/s from the request to the switch."""
    began = time.perf_counter()
    generation = catalog.begin_rebuild(NAME).generation
    background.wait(lambda: catalog.current(NAME).generation == generation, "the switch")
    return events / (time.perf_counter() - began)


class _ConsoleProcess:
    """``lakefold console`` on a free loopback port, reading ``dsn``."""

    def __init__(self, dsn: str, home: Path) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
        env |= {"LAKEFOLD_STORE_DSN": dsn, "LAKEFOLD_HOME": str(home)}
        lakefold = str(Path(sys.executable).with_name("lakefold"))
        self.log = (home / "console.log").open("wb")
        self.process = subprocess.Popen(  # noqa: S603 - our own CLI
            [lakefold, "console", "--port", str(self.port)], env=env, stdout=self.log,
            stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchmarkError(f"lakefold console exited ({self.process.returncode}); "
                                     f"see {self.log.name}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/api/overview")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
                conn.close()
            except OSError:
                pass
            time.sleep(0.2)
        raise BenchmarkError("lakefold console did not answer within a minute")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def _loaded_round(catalog: Any, background: BackgroundRunner, events: int, dsn: str, home: Path,
                  clients: int, interval: float, seconds: float
                  ) -> tuple[list[float], int, float]:
    """Start the console and the clients, rebuild while they poll (for at least ``seconds``),
    stop both: the latencies, the failures and the rebuild's events/s."""
    console = _ConsoleProcess(dsn, home)
    try:
        console.wait_ready()
        context = multiprocessing.get_context("spawn")  # this process holds a JVM
        stop, results = context.Event(), context.Queue()
        load = context.Process(target=poll_overview, args=(
            console.port, clients, interval, seconds, stop, results))
        load.start()
        try:
            time.sleep(min(2.0, seconds / 10))  # the clients are polling
            rate = _rebuild_events_per_s(catalog, background, events)
        finally:
            stop.set()
        latencies, errors = results.get(timeout=seconds + 120)
        load.join(timeout=60)
    finally:
        console.close()
    return latencies, errors, rate


def run(events: int, customers: int, batch: int, clients: int, interval: float,
        seconds: float, rounds: int = 1, store_dsn: str | None = None) -> Report:
    """Run the benchmark on throwaway services; see the module docstring."""
    from lakefold.projections import Runner, RunnerConfig
    from lakefold.projections.operations import RUNNER_SPARK_CONF, Catalog, SinkRoots
    from lakefold.spark import spark_session

    report = Report("console", {"events": events, "customers": customers, "batch": batch,
                                "clients": clients, "interval_s": interval,
                                "seconds": seconds, "rounds": rounds})
    scratch = Path(tempfile.mkdtemp(prefix="lakefold-bench-console-"))
    try:
        with history_store(report, events=events, per_stream=DEFAULT_PER_STREAM,
                           customers=customers, store_dsn=store_dsn) as dsn:
            spark = spark_session(conf={**RUNNER_SPARK_CONF,
                                        "spark.sql.shuffle.partitions": "2"},
                                  app_name="lakefold-bench-console")
            roots = SinkRoots.under(scratch)
            catalog = Catalog(dsn, roots)
            catalog.install()
            catalog.forget(NAME)
            runner = Runner(spark, _registry(batch), RunnerConfig(store_dsn=dsn, roots=roots,
                                                                  poll_seconds=0.1))
            background = BackgroundRunner(runner)
            latencies: list[float] = []
            errors = 0
            quiet: list[float] = []
            loaded: list[float] = []
            try:
                background.wait(lambda: _caught_up(catalog, events), "generation 1 caught up")
                for _ in range(rounds):
                    quiet.append(_rebuild_events_per_s(catalog, background, events))
                    more, failed, rate = _loaded_round(catalog, background, events, dsn,
                                                       scratch, clients, interval, seconds)
                    latencies += more
                    errors += failed
                    loaded.append(rate)
            finally:
                background.close()
                runner.close()
                catalog.close()
            if errors or not latencies:
                raise BenchmarkError(f"{errors} of {errors + len(latencies)} overview "
                                     "requests failed; the figures are invalid")
            baseline, result = statistics.median(quiet), statistics.median(loaded)
            report.baseline["projection_events_per_s"] = round(baseline)
            report.results |= {
                "overview_p50_ms": round(_percentile(latencies, 0.50) * 1000, 2),
                "overview_p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
                "overview_max_ms": round(max(latencies) * 1000, 2),
                "requests": len(latencies), "errors": errors,
                "projection_events_per_s": round(result),
                "throughput_effect_pct": round(100 * (1 - result / baseline), 2),
            }
            report.params["rounds_events_per_s"] = {
                "without_console": [round(x) for x in quiet],
                "with_console": [round(x) for x in loaded]}
            report.params["category"] = CATEGORY
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


@bench_app.command("console")
def console(
    events: Annotated[int, typer.Option(help="Events in the history.")] = 3_000_000,
    customers: Annotated[int, typer.Option(help="Distinct aggregate keys.")] = DEFAULT_CUSTOMERS,
    batch: Annotated[int, typer.Option(help="Records per rebuild micro-batch.")] = 100_000,
    clients: Annotated[int, typer.Option(help="Concurrent API clients.")] = 50,
    interval: Annotated[float, typer.Option(
        help="Seconds between one client's requests.")] = 1.0,
    seconds: Annotated[float, typer.Option(help="How long the clients poll (at least).")] = 60.0,
    rounds: Annotated[int, typer.Option(
        help="Rebuilds without, then with the console, this many times (medians).")] = 3,
    store_dsn: StoreDsnOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Console overview latency under 50 polling clients, and the projection throughput it
    costs."""
    if min(events, customers, batch, clients, rounds) < 1 or interval < 0 or seconds <= 0:
        raise BenchmarkError("need --events, --customers, --batch, --clients and --rounds >= 1,"
                             " --interval >= 0 and --seconds > 0")
    run(events, customers, batch, clients, interval, seconds, rounds,
        store_dsn).emit(as_json=as_json)
