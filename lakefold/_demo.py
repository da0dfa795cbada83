"""``lakefold demo``: a database write, captured, projected by Spark into Delta, queried back.

Steps: start (or reach) PostgreSQL, create a fresh ``lakefold_demo`` database with the shop
schema, attach a capture (slot + publication), run the workload, capture it into changelog
streams, project revenue per customer with Spark into a Delta table through the exactly-once
sink, then read the table back and compare it with the same aggregate computed by SQL.
Everything it starts is stopped before it returns, and it can run again right away.
"""

from __future__ import annotations

import shutil
import time
from contextlib import ExitStack
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lakefold import _shop
from lakefold.dsn import mask_dsn
from lakefold.exceptions import ConfigurationError, LakefoldError
from lakefold.local import LocalPostgres
from lakefold.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEMO_DATABASE = "lakefold_demo"
DEMO_SLOT = "lakefold_demo"
PROJECTION = "revenue_per_customer"


@dataclass(frozen=True)
class DemoResult:
    """What the demo produced: the Delta table's rows and whether they equal the source."""

    table_path: Path
    rows: list[tuple[int, str, int, Decimal]]
    matches_source: bool
    changes: int
    seconds: float


def connect(dsn: str, *, setting: str = "LAKEFOLD_DSN") -> psycopg.Connection[Any]:
    """Connect, or raise a one-line ConfigurationError naming the setting to fix."""
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as e:
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ConfigurationError(
            f"cannot connect to PostgreSQL at {mask_dsn(dsn)} ({reason}); "
            f"check {setting} or unset it to use the embedded server"
        ) from e


def _fresh_database(admin_dsn: str) -> str:
    """Drop and recreate the demo database (with its replication slots); return its DSN."""
    with connect(admin_dsn) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE database = %s AND active_pid IS NOT NULL", (DEMO_DATABASE,))
        for (slot,) in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (DEMO_DATABASE,)
        ).fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        name = sql.Identifier(DEMO_DATABASE)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(name))
    return psycopg.conninfo.make_conninfo(admin_dsn, dbname=DEMO_DATABASE)


def project_revenue(spark: SparkSession, store_dsn: str, table_path: Path) -> None:
    """Revenue per customer from the orders and customers changelog streams into Delta.

    Reads both streams through the ``lakefold_changelog`` Spark source, keeps the latest record
    per key (dropping deleted keys), aggregates, and overwrites the table in one Delta
    transaction whose app transaction version is the orders stream's head: re-running it for
    the same head is a no-op. (``lakefold run`` keeps such views up to date continuously.)
    """
    from pyspark.sql import functions as F

    from lakefold.capture import ChangelogStore
    from lakefold.spark import DeltaTarget, WriteMode, register_sources, write_batch

    register_sources(spark)
    with ChangelogStore(store_dsn) as store:
        orders_head = store.head("shop.orders")
    orders, customers = (_current_rows(spark, store_dsn, f"shop.{name}", key="id")
                         for name in ("orders", "customers"))
    revenue = (
        orders.groupBy("customer_id")
        .agg(F.count("id").cast("int").alias("orders"), F.sum("amount").alias("revenue"))
        .join(customers.select(F.col("id").alias("customer_id"), "name"), "customer_id")
        .select("customer_id", "name", "orders", "revenue")
    )
    target = DeltaTarget(path=str(table_path), mode=WriteMode.OVERWRITE,
                         app_id=f"{PROJECTION}@1", name=PROJECTION)
    write_batch(revenue, target, batch_id=orders_head)


def _current_rows(spark: SparkSession, store_dsn: str, stream: str, *, key: str) -> DataFrame:
    """The stream's latest record per key, without deleted keys, as a DataFrame."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from lakefold.spark import CHANGELOG_SOURCE

    frame = (spark.read.format(CHANGELOG_SOURCE).option("stream", stream)
             .option("dsn", store_dsn).load())
    latest = Window.partitionBy(key).orderBy(F.col("_position").desc())
    return (frame.withColumn("_rank", F.row_number().over(latest))
            .where((F.col("_rank") == 1) & (F.col("_op") != "delete"))
            .drop("_rank"))


def run_demo(settings: Settings, *, orders: int = 2_000, console: Console | None = None
             ) -> DemoResult:
    """Run the whole demo and print the Delta table; see the module docstring."""
    from lakefold.capture import Capture, CaptureConfig
    from lakefold.spark import read_delta, session_from_settings

    console = console or Console()
    started = time.monotonic()
    workload = _shop.Workload(orders=orders)
    table_path = (settings.lake_path / "demo" / PROJECTION).resolve()
    with ExitStack() as stack:
        admin_dsn = settings.source_dsn()
        if admin_dsn is None:
            server = stack.enter_context(LocalPostgres(settings.home / "postgres"))
            with console.status("starting the embedded PostgreSQL (wal_level=logical)"):
                server.start()
            admin_dsn = server.dsn()
            console.print(f"PostgreSQL running at {mask_dsn(admin_dsn)}")
        demo_dsn = _fresh_database(admin_dsn)
        with connect(demo_dsn) as conn:
            _shop.create_schema(conn)
        capture = Capture(CaptureConfig(source_dsn=demo_dsn, schema=_shop.SCHEMA,
                                        slot=DEMO_SLOT, publication=DEMO_SLOT))
        capture.setup()
        console.print(f"capturing schema [bold]{_shop.SCHEMA}[/] through slot {DEMO_SLOT}")

        with connect(demo_dsn) as conn, _progress(console) as progress:
            total = workload.customers + workload.products + workload.orders \
                + workload.orders // 5 + workload.orders // 20
            task = progress.add_task("writing the shop workload", total=total)
            changes = _shop.run_workload(conn, workload,
                                         progress=lambda n: progress.update(task, completed=n))
            end_lsn = _current_lsn(conn)
        with console.status(f"capturing {changes:,} changes into changelog streams"):
            stats = capture.run(until_lsn=end_lsn)
        console.print(f"captured {stats.records:,} records into the changelog in "
                      f"{stats.elapsed_s:.1f} s (slot confirmed at {stats.flushed_lsn_text})")

        if table_path.exists():
            shutil.rmtree(table_path)
        with console.status("starting Spark and projecting revenue per customer into Delta"):
            spark = session_from_settings(settings)
            stack.callback(spark.stop)
            project_revenue(spark, demo_dsn, table_path)
            frame = read_delta(spark, str(table_path)).orderBy("customer_id")
            rows = [(int(r["customer_id"]), str(r["name"]), int(r["orders"]),
                     Decimal(r["revenue"])) for r in frame.collect()]
        with connect(demo_dsn) as conn:
            expected = _shop.revenue_per_customer(conn)
    result = DemoResult(table_path=table_path, rows=rows, matches_source=rows == expected,
                        changes=changes, seconds=time.monotonic() - started)
    _print_result(console, result)
    if not result.matches_source:
        raise DemoMismatchError(
            "the Delta table differs from the aggregate computed on the source; "
            f"inspect {table_path} and report this as a bug")
    return result


class DemoMismatchError(LakefoldError):
    """The projected table does not equal the source aggregate."""


def _current_lsn(conn: psycopg.Connection[Any]) -> int:
    from lakefold.capture import parse_lsn

    (lsn,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone() or ("0/0",)
    return parse_lsn(str(lsn))


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=False)


def _print_result(console: Console, result: DemoResult) -> None:
    table = Table(title=f"Delta table {PROJECTION} ({len(result.rows)} customers, top 10 by "
                        f"revenue) at {result.table_path}")
    for column, justify in (("customer", "right"), ("name", "left"), ("orders", "right"),
                            ("revenue", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in sorted(result.rows, key=lambda r: r[3], reverse=True)[:10]:
        table.add_row(str(row[0]), row[1], str(row[2]), f"{row[3]:,.2f}")
    console.print(table)
    verdict = "[green]equals[/]" if result.matches_source else "[red]DIFFERS FROM[/]"
    console.print(f"Delta table {verdict} the same aggregate computed by SQL on the source "
                  f"({result.changes:,} changes, {result.seconds:.1f} s)")
