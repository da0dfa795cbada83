"""`lakefold demo` end to end on the embedded default: over the leftovers of an earlier run
(its database, replication slot and sinks), it shows the views (event time included: a window
corrected by a late event, orders enriched as of their commit), rebuilds two with a generation
switch (the enriched one to the same rows), leaves nothing running, and the revenue Delta
table (read by an independent reader) equals the aggregate computed on the source."""

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import psutil
import psycopg
import pytest
from deltalake import DeltaTable
from psycopg import sql

from lakefold.demo import _shop
from lakefold.demo._run import DEMO_DATABASE, DEMO_SLOT, PROJECTION
from lakefold.demo._views import REBUILT
from lakefold.local import LocalPostgres
from lakefold.projections.operations import Catalog

LAKEFOLD = str(Path(sys.executable).parent / "lakefold")
VIEWS = ("revenue_per_customer", "customer_cache", "product_search", "price_history",
         "order_lines", "revenue_by_city", "orders_per_minute", "orders_with_city")


def _processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(text in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


def _leave_an_earlier_run(home: Path) -> None:
    """What a finished earlier run leaves: the demo database with its slot, and sinks
    (a corrupt Delta log and Spark checkpoint, which a rerun must not pick up)."""
    with LocalPostgres(home / "postgres", durable=False) as server:
        server.start()
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DEMO_DATABASE)))
        with psycopg.connect(server.dsn(DEMO_DATABASE), autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')",
                         (DEMO_SLOT,))
    delta_log = home / "lake" / "demo" / PROJECTION / "g1" / "_delta_log"
    for stale in (delta_log / ("0" * 20 + ".json"),
                  home / "demo" / "checkpoints" / PROJECTION / "g1" / "offsets" / "0"):
        stale.parent.mkdir(parents=True, exist_ok=True)
        stale.write_text("left by an earlier run")


@pytest.mark.timeout(400)
def test_demo_shows_rebuilds_and_checks_every_view_after_an_earlier_run(tmp_path: Path
                                                                        ) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    home = tmp_path / "home"
    env["LAKEFOLD_HOME"] = str(home)
    env["COLUMNS"] = "200"  # rich's tables unwrapped
    _leave_an_earlier_run(home)

    out = subprocess.run([LAKEFOLD, "demo", "--rows", "800"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    for view in VIEWS:
        assert f"{view} equals the same data computed by SQL on the source" in out.stdout
    assert "orders_with_city rebuilt equals its live generation's rows" in out.stdout
    assert "generation 1 -> 2" in out.stdout
    # the search shows why each hit ranks where it does: the text that matched
    assert "matched (why it ranks here)" in out.stdout
    assert "[oak]" in out.stdout or "[lamp]" in out.stdout
    assert "Using incubator modules" not in out.stdout + out.stderr  # Spark's noise: its log
    assert not _processes_mentioning(str(tmp_path)), "the demo left processes behind"

    with LocalPostgres(home / "postgres", durable=False) as server:
        server.start()
        with Catalog(server.dsn(DEMO_DATABASE)) as catalog:
            live = catalog.current(PROJECTION)
            rebuilt = catalog.current(REBUILT)
        with psycopg.connect(server.dsn(DEMO_DATABASE)) as conn:
            expected = _shop.revenue_per_customer(conn)
    assert rebuilt.generation == 2
    delta_rows = sorted(
        (int(r["customer_id"]), r["name"], int(r["orders"]), Decimal(r["revenue"]))
        for r in DeltaTable(live.location("delta")).to_pyarrow_table().to_pylist()
    )
    assert delta_rows == expected
    assert len(expected) > 100
