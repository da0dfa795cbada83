"""``lakefold bench views``: a chain of two views over three captured tables, kept up to date.

Set-up (throwaway PostgreSQL with fsync on, local Spark): ``customers`` (``--customers`` rows,
in ``CITIES`` cities), ``products`` (``--products``) and ``orders`` (``--orders``), captured
into the changelog by an initial snapshot; the views of the user story: ``order_lines``
(orders ⋈ customers ⋈ products) and ``revenue_by_city`` (a GROUP BY city over
``order_lines``), each into a Delta upsert table.

- ``results.rebuild_rows_per_s``: the chain built from nothing (the input states, both views'
  full computations, their output streams and Delta tables), input rows per second; beside it
  ``baseline.full_recompute_rows_per_s``, the input rows over the full recompute's seconds.
- ``results.batch_cost_ratio``: one incremental batch of both views after 1 % of the orders
  changed (one transaction), divided by ``baseline.full_recompute_s``: Spark computing both
  views from the same inputs in full, same run. ``results.batch_s`` is that batch's time;
  ``results.empty_batch_s`` the time of a batch after a single change (the fixed cost per batch,
  Spark's jobs mostly: the floor under the ratio).
- ``results.view_p50_ms`` / ``view_p99_ms``: commit to visible in ``revenue_by_city``'s Delta
  table (two stages) under a steady ``--rate`` changes per second (30 % updates, 10 % deletes,
  inserts, some customers moving city), with the capture in a process of its own as in a
  deployment. Probes: ``--probes`` times per second a new customer in a city of its own places
  one order; the probe is visible when its city's row is in the table.
- ``results.store``: what the store keeps (``store_size``: the database's growth, split into
  the views' state tables and lakefold's schema). ``changelog_bytes`` (and per source row):
  the captured tables' changelog after the initial snapshot. ``views.<view>``: what the view's
  build from nothing kept (``store_bytes``; of it ``state_table_bytes``, its inputs' latest
  rows, its own rows and aggregates, and ``stream_bytes``, its output stream; ``state_tables``:
  each of its latest-rows tables by stream, with indexes), per row of
  its input (``bytes_per_input_row``: the three tables' rows for ``order_lines``, its lines
  for ``revenue_by_city``); ``views_bytes_per_input_row``: both views over the source's rows.
  ``bytes_per_change_under_load``: the store's growth (the source's tables left out) during
  the steady load, per source change (changelog, states and both output streams).

With ``--master spark://...`` and/or ``--lake s3://BUCKET/PREFIX`` (endpoint and credentials
from the ``LAKEFOLD_S3_*`` settings), a second chain (generation 2, its own state tables and
output streams) is built after the local figures, on the same source, with its Spark jobs on
that cluster and its Delta tables in that bucket: ``results.<where>`` (rebuild, 1 % batch and
its ratio, one-change batch) and ``baseline.<where>`` (its full recompute, same session),
``<where>`` being ``cluster``, ``s3`` or ``cluster+s3``. The latency under load is measured
locally only.
"""

from __future__ import annotations

import multiprocessing
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

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
from lakefold._bench.latency import _capture_main, _percentile
from lakefold._bench.report import BenchmarkError, Report

CITIES = 50
ORDER_LINES = """
    SELECT o.id AS order_id, o.customer_id, c.city, p.category, o.amount
    FROM orders o JOIN customers c ON o.customer_id = c.id
    JOIN products p ON o.product_id = p.id"""
REVENUE_BY_CITY = """
    SELECT city, count(*) AS orders, sum(amount) AS revenue, avg(amount) AS average,
           min(amount) AS smallest, max(amount) AS largest,
           count(DISTINCT customer_id) AS customers
    FROM lines GROUP BY city"""
_SETUP = [
    "CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, city text NOT NULL)",
    "CREATE TABLE products (id bigint PRIMARY KEY, category text NOT NULL)",
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, "
    "product_id bigint NOT NULL, amount numeric(12, 2) NOT NULL)",
]


@dataclass(frozen=True)
class _Shape:
    orders: int
    customers: int
    products: int
    seconds: float
    rate: int
    probes_per_s: float
    warmup: float


def _load(dsn: str, shape: _Shape) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO customers SELECT i, 'customer ' || i, 'city ' || (i %% %s) "
                     "FROM generate_series(1, %s) i", (CITIES, shape.customers))
        conn.execute("INSERT INTO products SELECT i, 'category ' || (i %% 20) "
                     "FROM generate_series(1, %s) i", (shape.products,))
        conn.execute("INSERT INTO orders SELECT i, 1 + (i::bigint * 7919) %% %s, "
                     "1 + (i::bigint * 31) %% %s, (i %% 997) + 0.5 "
                     "FROM generate_series(1, %s) i",
                     (shape.customers, shape.products, shape.orders))


class _Chain:
    """The two views (maintainers and Delta target writers), stepped together."""

    def __init__(self, spark: Any, dsn: str, root: str, generation: int = 1) -> None:
        """The views as generation ``generation`` (a second chain beside the first keeps state
        tables and output streams of its own), their Delta tables under ``root`` (a local
        directory or ``s3://BUCKET/PREFIX``)."""
        from lakefold.projections import delta_table
        from lakefold.projections.operations import (
            TargetContext,
            ViewTargetWriter,
            open_view,
            output_stream,
        )

        tables = {"orders": "public.orders", "customers": "public.customers",
                  "products": "public.products"}
        self.dsn = dsn
        g = generation
        self.lines = open_view(spark, dsn, view="order_lines", generation=g, inputs=tables,
                               query=ORDER_LINES, key=["order_id"])
        self.revenue = open_view(spark, dsn, view="revenue_by_city", generation=g,
                                 inputs={"lines": output_stream("order_lines", g)},
                                 query=REVENUE_BY_CITY, key=["city"])
        self.path = f"{root}/revenue_by_city"
        self.writers = [
            ViewTargetWriter(dsn, self.lines.output.name, delta_table(
                "upsert", keys=["order_id"]).open(f"{root}/order_lines",
                                                  TargetContext("order_lines", g)),
                reader=f"bench:order_lines@{g}"),
            ViewTargetWriter(dsn, self.revenue.output.name, delta_table(
                "upsert", keys=["city"]).open(self.path, TargetContext("revenue_by_city", g)),
                reader=f"bench:revenue_by_city@{g}"),
        ]

    def build(self) -> dict[str, dict[str, Any]]:
        """The chain's first step (each view built from nothing, then its target), with what
        each view's build kept in the store (``StoreSize.growth_since``; its target's reader
        checkpoint left out)."""
        from lakefold._bench.store_size import StoreSize, state_tables

        kept: dict[str, dict[str, Any]] = {}
        for view, writer in zip((self.lines, self.revenue), self.writers, strict=True):
            before = StoreSize.of(self.dsn)
            view.step()
            kept[view.view] = {**StoreSize.of(self.dsn).growth_since(before),
                               "state_tables": state_tables(self.dsn, view.owner)}
            while writer.step() is not None:
                pass
        return kept

    def step(self) -> bool:
        moved = False
        for view, writer in zip((self.lines, self.revenue), self.writers, strict=True):
            moved = view.step() is not None or moved
            while writer.step() is not None:
                moved = True
        return moved

    def full_recompute_s(self) -> float:
        began = time.perf_counter()
        for view in (self.lines, self.revenue):
            view.compute()
        return time.perf_counter() - began

    def close(self) -> None:
        for view in (self.lines, self.revenue):
            view.close()
        for writer in self.writers:
            writer.close()
            writer.target.close()


def _measure(spark: Any, dsn: str, root: str, generation: int, rows: int
             ) -> tuple[_Chain, dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """A chain built from nothing under ``root``, then its batch after 1 % of the orders
    changed (against a full recompute on the same session) and after one change: (the chain,
    results, baseline, what each view's build kept in the store)."""
    import psycopg

    began = time.perf_counter()
    chain = _Chain(spark, dsn, root, generation)
    try:
        kept = chain.build()
        results: dict[str, Any] = {
            "rebuild_rows_per_s": round(rows / (time.perf_counter() - began))}
        chain.step()  # warm: the first incremental batch plans Spark's jobs
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE orders SET amount = amount + 1 WHERE id % 100 = 0")
        _capture(dsn)
        began = time.perf_counter()
        chain.step()
        batch = time.perf_counter() - began
        full = chain.full_recompute_s()
        results["batch_s"] = round(batch, 3)
        baseline = {"full_recompute_s": round(full, 3),
                    "full_recompute_rows_per_s": round(rows / full)}
        results["batch_cost_ratio"] = round(batch / full, 4)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE orders SET amount = amount + 1 WHERE id = 1")
        _capture(dsn)
        began = time.perf_counter()
        chain.step()
        results["empty_batch_s"] = round(time.perf_counter() - began, 3)
    except BaseException:
        chain.close()
        raise
    return chain, results, baseline, kept


def _capture(dsn: str) -> None:
    import psycopg

    from lakefold.capture import Capture, parse_lsn

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None  # noqa: S101
    Capture(_config(dsn)).run(until_lsn=parse_lsn(row[0]))


def _config(dsn: str) -> Any:
    from lakefold.capture import CaptureConfig

    return CaptureConfig(source_dsn=dsn, slot="bench_views", publication="bench_views",
                         tables=("public.orders", "public.customers", "public.products"))


def _application_main(dsn: str, path: str, shape: _Shape) -> dict[str, Any]:
    """The application process: the steady load and the probes, and a poller of the view's
    Delta table; returns the achieved rate and the probes' latencies (ms)."""
    import random

    import psycopg
    from deltalake import DeltaTable

    committed: dict[int, float] = {}
    seen: dict[int, float] = {}
    stop = threading.Event()
    began = time.perf_counter()

    def poll() -> None:
        table = DeltaTable(path)
        while not stop.is_set():
            table.update_incremental()
            cities = table.to_pyarrow_table(columns=["city"]).column("city").to_pylist()
            now = time.perf_counter()
            for city in cities:
                if str(city).startswith("probe "):
                    seen.setdefault(int(str(city).split()[-1]), now)
            time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    rng = random.Random(7)  # noqa: S311 - a reproducible workload, not secrets
    changes, probe, next_probe, ticks = 0, 0, began, 0
    tick = 0.01
    per_tick = max(1, round(shape.rate * tick))
    next_order = shape.orders + 1
    next_customer = shape.customers + 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        end = began + shape.warmup + shape.seconds
        while (now := time.perf_counter()) < end:
            if now >= next_probe:
                probe += 1
                with conn.transaction():
                    conn.execute("INSERT INTO customers VALUES (%s, 'probe', %s)",
                                 (next_customer, f"probe {probe}"))
                    conn.execute("INSERT INTO orders VALUES (%s, %s, 1, 1)",
                                 (next_order, next_customer))
                committed[probe] = time.perf_counter()
                next_customer += 1
                next_order += 1
                changes += 2
                next_probe += 1.0 / shape.probes_per_s
            with conn.transaction(), conn.cursor() as cursor:
                for _ in range(per_tick):
                    kind = rng.random()
                    if kind < 0.30:
                        cursor.execute("UPDATE orders SET amount = amount + 1 WHERE id = %s",
                                       (rng.randrange(1, shape.orders),))
                    elif kind < 0.40:
                        cursor.execute("DELETE FROM orders WHERE id = %s",
                                       (rng.randrange(1, shape.orders),))
                    elif kind < 0.42:
                        cursor.execute("UPDATE customers SET city = %s WHERE id = %s",
                                       (f"city {rng.randrange(CITIES)}",
                                        rng.randrange(1, shape.customers)))
                    else:
                        cursor.execute("INSERT INTO orders VALUES (%s, %s, %s, %s)",
                                       (next_order, rng.randrange(1, shape.customers),
                                        rng.randrange(1, shape.products), rng.randrange(1, 999)))
                        next_order += 1
            changes += per_tick
            ticks += 1
            pause = began + ticks * tick - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        elapsed = time.perf_counter() - began
    deadline = time.perf_counter() + 30
    while len(seen) < len(committed) and time.perf_counter() < deadline:
        time.sleep(0.1)
    stop.set()
    poller.join(timeout=10)
    counted = [n for n, at in committed.items() if at >= began + shape.warmup]
    latencies = [(seen[n] - committed[n]) * 1000 for n in counted if n in seen]
    return {"achieved_rate": round(changes / elapsed), "changes": changes,
            "probes": len(counted),
            "missed": len(counted) - len(latencies), "latencies": latencies}


def _store_figures(shape: _Shape, captured: int,
                   kept: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``results.store``: what the store keeps for the chain after its build (see the module
    docstring), per view and per input row."""
    rows = shape.orders + shape.customers + shape.products
    # order_lines reads the three tables; revenue_by_city reads order_lines (a line per order)
    inputs = {"order_lines": rows, "revenue_by_city": shape.orders}
    views = {name: {**kept[name], "input_rows": inputs[name],
                    "bytes_per_input_row": round(kept[name]["store_bytes"] / inputs[name], 1)}
             for name in ("order_lines", "revenue_by_city")}
    total = sum(view["store_bytes"] for view in views.values())
    return {"changelog_bytes": captured, "changelog_bytes_per_row": round(captured / rows, 1),
            "views": views, "views_bytes": total,
            "views_bytes_per_input_row": round(total / rows, 1)}


@dataclass(frozen=True)
class _StoreApart:
    """The store's database without the source's tables (this bench's source database is
    also its store)."""

    database: int
    source: int

    @classmethod
    def of(cls, dsn: str) -> _StoreApart:
        from lakefold._bench.store_size import database_bytes, schema_bytes

        return cls(database_bytes(dsn), schema_bytes(dsn, ["public"]))

    def growth_since(self, before: _StoreApart) -> int:
        return (self.database - before.database) - (self.source - before.source)


def run(shape: _Shape, master: str | None = None, lake: str | None = None) -> Report:
    """Run the benchmark on throwaway services; see the module docstring."""
    import psycopg

    from lakefold._bench.store_size import StoreSize
    from lakefold.capture import Capture
    from lakefold.local import LocalPostgres
    from lakefold.projections.operations import RUNNER_SPARK_CONF
    from lakefold.spark import spark_session

    report = Report("views", {"orders": shape.orders, "customers": shape.customers,
                              "products": shape.products, "rate": shape.rate,
                              "seconds": shape.seconds, "probes_per_s": shape.probes_per_s})
    where = elsewhere(master, lake)
    if where is not None:
        report.params |= {"master": master or "local[2]", "lake": lake or "local disk"}
    store = lake_store(lake)
    conf = {**RUNNER_SPARK_CONF, "spark.sql.shuffle.partitions": "2"}
    scratch = Path(tempfile.mkdtemp(prefix="lakefold-bench-views-"))
    spawn = multiprocessing.get_context("spawn")
    capture_stop = spawn.Event()
    chain: _Chain | None = None
    try:
        with LocalPostgres(durable=True) as server:
            server.start()
            dsn = server.dsn()
            with psycopg.connect(dsn, autocommit=True) as conn:
                for statement in _SETUP:
                    conn.execute(statement)
            _load(dsn, shape)
            rows = shape.orders + shape.customers + shape.products
            before = StoreSize.of(dsn)
            Capture(_config(dsn)).setup()  # the initial snapshot
            _capture(dsn)
            captured = StoreSize.of(dsn).growth_since(before)["store_bytes"]
            # One driver JVM for every figure: with --lake, hadoop-aws is on its class path
            # from the start (the local figures' session carries it too, unused).
            spark = spark_session("local[2]", conf=conf, app_name="lakefold-bench-views",
                                  object_store=store)
            chain, results, baseline, kept = _measure(spark, dsn, str(scratch / "local"), 1,
                                                      rows)
            report.results |= results
            report.baseline |= baseline
            report.results["store"] = _store_figures(shape, captured, kept)

            capture = spawn.Process(target=_capture_main, args=(_config(dsn), capture_stop),
                                    daemon=True)
            capture.start()
            stop = threading.Event()
            errors: list[BaseException] = []

            def keep_up() -> None:
                assert chain is not None  # noqa: S101
                try:
                    while not stop.is_set():
                        if not chain.step():
                            time.sleep(0.05)
                except BaseException as e:
                    errors.append(e)

            runner = threading.Thread(target=keep_up, daemon=True)
            runner.start()
            from concurrent.futures import ProcessPoolExecutor

            loaded = _StoreApart.of(dsn)
            with ProcessPoolExecutor(1, mp_context=spawn) as application:
                outcome = application.submit(_application_main, dsn, chain.path,
                                             shape).result()
            stop.set()
            runner.join(timeout=60)
            grown = _StoreApart.of(dsn).growth_since(loaded)
            report.results["store"]["bytes_per_change_under_load"] = round(
                grown / max(outcome["changes"], 1), 1)
            if errors:
                raise BenchmarkError(f"the views failed under load: {errors[0]}") from errors[0]
            latencies = outcome["latencies"]
            report.params["achieved_rate"] = outcome["achieved_rate"]
            report.params["probes"] = outcome["probes"]
            report.params["probes_missed"] = outcome["missed"]
            report.results["view_p50_ms"] = round(_percentile(latencies, 0.50), 1)
            report.results["view_p99_ms"] = round(_percentile(latencies, 0.99), 1)
            capture_stop.set()
            capture.join(timeout=60)
            if where is not None:  # the same figures on the cluster and/or in the bucket
                chain.close()
                chain = None
                spark.stop()
                spark = spark_session(master or "local[2]", conf=conf,
                                      app_name="lakefold-bench-views", object_store=store)
                root = run_root(lake, scratch) if lake else str(scratch / where)
                try:
                    away, results, baseline, _ = _measure(spark, dsn, root, 2, rows)
                    away.close()
                finally:
                    spark.stop()
                    if lake:
                        remove_run_root(root)
                report.results[where] = results
                report.baseline[where] = baseline
    finally:
        capture_stop.set()
        if chain is not None:
            chain.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return report


@bench_app.command("views")
def views(
    orders: Annotated[int, typer.Option(help="Orders in the source.")] = 1_000_000,
    customers: Annotated[int, typer.Option(help="Customers in the source.")] = 100_000,
    products: Annotated[int, typer.Option(help="Products in the source.")] = 10_000,
    seconds: Annotated[float, typer.Option(help="Measured seconds of steady load.")] = 60,
    rate: Annotated[int, typer.Option(help="Changes per second under load.")] = 1_000,
    probes: Annotated[float, typer.Option(help="Probes per second.")] = 2.0,
    warmup: Annotated[float, typer.Option(help="Seconds of load not counted.")] = 10.0,
    master: MasterOption = None,
    lake: LakeOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """A chain of views (a join, then a GROUP BY over it): rebuild rate, incremental batch
    cost against a full recompute, and commit-to-visible latency."""
    if min(orders, customers, products) < 100 or seconds <= 0 or rate <= 0 or probes <= 0 \
            or warmup < 0:
        raise BenchmarkError("need --orders, --customers and --products >= 100, --seconds > 0, "
                             "--rate > 0, --probes > 0 and --warmup >= 0")
    run(_Shape(orders, customers, products, seconds, rate, probes, warmup), master, lake).emit(
        as_json=as_json)
