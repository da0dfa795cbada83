"""``lakefold demo``: database writes and domain events, captured, projected by Spark into views,
rebuilt, queried back.

Steps: start (or reach) PostgreSQL and Redis, create a fresh ``lakefold_demo`` database with the
shop schema and an event store, attach a capture (slot + publication), run the workload (and
the shop's ``OrderPlaced`` events, ``lakefold.demo._events``), capture it into changelog
streams, then run the demo shop's four projections (revenue per customer in Delta, a customer
cache in Redis, a product search index, an SCD2 price history in Delta), show them, rebuild one
with a generation switch, and compare every view with the same data computed by SQL on the
source (``lakefold.demo._views``). Everything it starts is stopped before it returns, and it
can run again right away.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lakefold.core.dsn import error_text, mask_dsn
from lakefold.core.exceptions import ConfigurationError, TerminalError
from lakefold.demo import _shop
from lakefold.demo._events import OrderEvents
from lakefold.demo._views import REVENUE, show_views
from lakefold.eventstore import EventStore
from lakefold.local import LocalPostgres, LocalRedis
from lakefold.settings import Settings

DEMO_DATABASE = "lakefold_demo"
DEMO_SLOT = "lakefold_demo"
PROJECTION = REVENUE
#: products whose price changes after the workload, so price_history has closed versions
PRICE_CHANGES = 5


@dataclass(frozen=True)
class DemoResult:
    """What the demo produced: the revenue view's live Delta table and rows, whether each
    view equals the source, and the rebuilt view's generations (before, after)."""

    table_path: Path
    rows: list[tuple[int, str, int, Decimal]]
    matches_source: bool
    views: dict[str, bool]
    generations: tuple[int, int]
    changes: int
    seconds: float


def connect(dsn: str, *, setting: str = "LAKEFOLD_DSN") -> psycopg.Connection[Any]:
    """Connect, or raise a one-line ConfigurationError naming the setting to fix."""
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as e:
        reason = error_text(e)
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


def run_demo(settings: Settings, *, orders: int = 2_000, console: Console | None = None
             ) -> DemoResult:
    """Run the whole demo and print its views; see the module docstring."""
    from lakefold._from_settings import session_from_settings
    from lakefold.capture import Capture, CaptureConfig
    from lakefold.projections.operations import RUNNER_SPARK_CONF

    console = console or Console()
    started = time.monotonic()
    workload = _shop.Workload(orders=orders)
    with ExitStack() as stack:
        admin_dsn = settings.source_dsn()
        if admin_dsn is None:
            server = stack.enter_context(LocalPostgres(settings.home / "postgres"))
            with console.status("starting the embedded PostgreSQL (wal_level=logical)"):
                server.start()
            admin_dsn = server.dsn()
            console.print(f"PostgreSQL running at {mask_dsn(admin_dsn)}")
        redis_url = _redis_url(settings, stack, console)
        demo_dsn = _fresh_database(admin_dsn)
        with connect(demo_dsn) as conn:
            _shop.create_schema(conn)
            # a deleted order must carry its customer_id for revenue_per_customer's fold
            conn.execute(sql.SQL("ALTER TABLE {}.orders REPLICA IDENTITY FULL").format(
                sql.Identifier(_shop.SCHEMA)))
        # the application's event store, recording each append's place in commit order
        with EventStore(demo_dsn) as store:
            store.install()
            store.record_commit_order()
        capture = Capture(CaptureConfig(source_dsn=demo_dsn, schema=_shop.SCHEMA,
                                        slot=DEMO_SLOT, publication=DEMO_SLOT))
        capture.setup()
        console.print(f"capturing schema [bold]{_shop.SCHEMA}[/] through slot {DEMO_SLOT}")

        with connect(demo_dsn) as conn, _progress(console) as progress:
            total = workload.customers + workload.products + workload.orders \
                + workload.orders // 5 + workload.orders // 20 + PRICE_CHANGES
            task = progress.add_task("writing the shop workload", total=total)
            changes = _shop.run_workload(conn, workload,
                                         progress=lambda n: progress.update(task, completed=n))
            conn.execute(sql.SQL("UPDATE {}.products SET price = price + 1 WHERE id <= %s")
                         .format(sql.Identifier(_shop.SCHEMA)), (PRICE_CHANGES,))
            changes += PRICE_CHANGES
            progress.update(task, completed=changes)
        order_events = OrderEvents(demo_dsn)
        with console.status("the shop appends OrderPlaced events to its event store"):
            appended = order_events.append_all(seed=workload.seed)
        console.print(f"the shop appended {appended} OrderPlaced events (event times 3 s apart, "
                      "a few out of order)")
        with connect(demo_dsn) as conn:
            end_lsn = _current_lsn(conn)
        with console.status(f"capturing {changes:,} changes into changelog streams"):
            stats = capture.run(until_lsn=end_lsn)
        console.print(f"captured {stats.records:,} records into the changelog in "
                      f"{stats.elapsed_s:.1f} s (slot confirmed at {stats.flushed_lsn_text})")

        with console.status("starting Spark"):
            spark = session_from_settings(settings, app_name="lakefold-demo", conf={
                **RUNNER_SPARK_CONF, "spark.sql.shuffle.partitions": "2"})
            stack.callback(spark.stop)
        def capture_now() -> None:
            with connect(demo_dsn) as conn:
                capture.run(until_lsn=_current_lsn(conn))

        views = show_views(spark, demo_dsn, home=settings.home / "demo",
                           lake=settings.lake_path / "demo", redis_url=redis_url,
                           capture=capture_now, console=console, events=order_events)
    result = DemoResult(table_path=Path(views.revenue_path), rows=views.revenue_rows,
                        matches_source=all(views.matches.values()), views=views.matches,
                        generations=views.generations, changes=changes,
                        seconds=time.monotonic() - started)
    checked = [v for v in views.matches if not v.endswith(" rebuilt")]
    console.print(f"{len(checked)} views checked against the source "
                  f"({result.changes:,} changes, {result.seconds:.1f} s)")
    if not result.matches_source:
        differ = ", ".join(v for v, ok in views.matches.items() if not ok)
        raise DemoMismatchError(
            f"the views {differ} differ from the same data computed on the source; "
            "report this as a bug")
    return result


def _redis_url(settings: Settings, stack: ExitStack, console: Console) -> str:
    """The configured Redis, or a throwaway local one (stopped with ``stack``)."""
    if settings.redis_url is not None:
        return settings.redis_url.get_secret_value()
    server = stack.enter_context(LocalRedis())
    with console.status("starting a throwaway Redis"):
        server.start()
    return server.url


class DemoMismatchError(TerminalError):
    """The projected table does not equal the source aggregate."""


def _current_lsn(conn: psycopg.Connection[Any]) -> int:
    from lakefold.capture import parse_lsn

    (lsn,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone() or ("0/0",)
    return parse_lsn(str(lsn))


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=False)
