"""Rebuilding views: ``rebuild`` of the upstream view of a chain builds a new generation of it
and of the view that reads it, while the source keeps changing; both switch in one catalog
transaction, and after every tick (before, during and after the rebuild) a reader sees a pair
of one generation whose aggregate agrees with its lines, and the views equal the SQL on the
source. The retired generations stop holding compaction. ``lakefold status`` shows each
view's inputs and its lag per input."""

from __future__ import annotations

import random
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable
from typer.testing import CliRunner

from lakefold.capture import CaptureConfig
from lakefold.cli import app
from lakefold.projections import Runner, RunnerConfig
from lakefold.projections.definitions._api import Registry, registering_into, view
from lakefold.projections.definitions._model import changelog
from lakefold.projections.definitions._target_specs import delta_table
from lakefold.projections.exceptions import ProjectionStateError
from lakefold.projections.operations import Catalog, SinkRoots, projection_status
from lakefold.store import ChangelogStore
from tests.capture.conftest import capture_now
from tests.projections.view_shop import ORDER_LINES, REVENUE_BY_CITY, oracle

pytestmark = pytest.mark.timeout(300)
SHOP = {"orders": changelog("public.orders"), "customers": changelog("public.customers"),
        "products": changelog("public.products")}
CHAIN = ("order_lines", "revenue_by_city")
VIEW_PROJECTIONS = str(Path(__file__).with_name("view_projections.py"))


def _registry() -> Registry:
    registry = Registry()
    with registering_into(registry):
        view("order_lines", inputs=SHOP, key=["order_id"], query=ORDER_LINES,
             target=delta_table("upsert", keys=["order_id"]))
        view("revenue_by_city", inputs={"lines": "order_lines"}, key="city",
             query=REVENUE_BY_CITY, target=delta_table("upsert", keys=["city"]))
    return registry


def _change(dsn: str, rng: random.Random, round_: int) -> None:
    """One source transaction: orders in, out and moved; a customer moving city."""
    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("INSERT INTO orders VALUES (%s, %s, %s, %s)",
                     (100 + round_, rng.randrange(1, 7), rng.randrange(1, 5),
                      rng.randrange(1, 999)))
        conn.execute("DELETE FROM orders WHERE id = %s", (rng.randrange(1, 16),))
        conn.execute("UPDATE orders SET customer_id = %s WHERE id = %s",
                     (rng.randrange(1, 7), rng.randrange(1, 16)))
        conn.execute("UPDATE customers SET city = %s WHERE id = %s",
                     (rng.choice(("Oslo", "Lima", "Pune")), rng.randrange(1, 7)))


def _pair(dsn: str, catalog: Catalog, together: bool
          ) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """What a reader sees: both views' generations read in one catalog query (``together``:
    they are of one rebuild), and their Delta tables at those generations."""
    with psycopg.connect(dsn) as conn:
        generations: dict[str, int] = dict(conn.execute(
            "SELECT name, current_generation FROM lakefold.projections WHERE name = ANY(%s)",
            (list(CHAIN),)).fetchall())
    if together:
        assert generations["order_lines"] == generations["revenue_by_city"], generations
    tables = {name: DeltaTable(catalog.generation(name, generations[name]).location("delta"))
              .to_pyarrow_table().to_pylist() for name in CHAIN}
    return ({r["order_id"]: r for r in tables["order_lines"]},
            {r["city"]: r for r in tables["revenue_by_city"]})


def _check_pair(dsn: str, catalog: Catalog, *, together: bool = True) -> None:
    """The pair agrees with itself (the aggregate is of the lines) and with the source."""
    lines, revenue = _pair(dsn, catalog, together)
    totals: dict[Any, list[Any]] = defaultdict(lambda: [0, Decimal(0)])
    for line in lines.values():
        totals[line["city"]][0] += 1
        totals[line["city"]][1] += line["amount"]
    assert {city: (r["orders"], r["revenue"]) for city, r in revenue.items()} == {
        city: tuple(t) for city, t in totals.items()}
    assert lines == {k[0]: row for k, row in oracle(dsn, "order_lines").items()}


def test_rebuilding_the_upstream_view_switches_the_chain_together(
        spark: Any, shop: CaptureConfig, tmp_path: Path) -> None:
    dsn, rng = shop.source_dsn, random.Random(7)
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.1)
    with Runner(spark, _registry(), config) as runner, Catalog(dsn) as catalog:
        runner.prepare()
        views = runner.views
        assert views is not None
        for round_ in range(3):
            views.tick()
            _check_pair(dsn, catalog)
            _change(dsn, rng, round_)
            capture_now(shop)
        generation = runner.request_rebuild("order_lines")
        assert generation.generation == 2
        assert [catalog.building(n).generation for n in CHAIN] == [2, 2]  # type: ignore[union-attr]
        with pytest.raises(ProjectionStateError, match="already being rebuilt"):
            runner.request_rebuild("revenue_by_city")
        for round_ in range(3, 8):  # writes go on: the rebuild catches up and switches
            views.tick()
            _check_pair(dsn, catalog)
            _change(dsn, rng, round_)
            capture_now(shop)
        views.tick()
        _check_pair(dsn, catalog)
        assert [catalog.current(n).generation for n in CHAIN] == [2, 2]
        assert {name: catalog.generation(name, 1).status for name in CHAIN} == {
            "order_lines": "retired", "revenue_by_city": "retired"}
        with ChangelogStore(dsn) as store:  # the retired generations hold nothing any more
            readers = {r.reader for r in store.readers()}
            assert not {r for r in readers if "@1" in r}, readers
            assert {"view:order_lines@2", "view:revenue_by_city@2"} <= readers
            # nor their output streams: a rebuild does not leave a copy of a view behind
            streams = {s.name for s in store.streams()}
        assert {"lakefold_views.order_lines_g2", "lakefold_views.revenue_by_city_g2"} <= streams
        assert not {"lakefold_views.order_lines_g1", "lakefold_views.revenue_by_city_g1"} & \
            streams
        with psycopg.connect(dsn) as conn:  # and no record of theirs is left behind
            assert conn.execute(
                "SELECT count(*) FROM lakefold.changelog c WHERE NOT EXISTS (SELECT 1 FROM "
                "lakefold.changelog_streams s WHERE s.stream_id = c.stream_id)").fetchone() \
                == (0,)
        with psycopg.connect(dsn) as conn:
            owners = {r[0] for r in conn.execute("SELECT owner FROM lakefold.stream_states")}
        assert owners == {"view:order_lines@2", "view:revenue_by_city@2"}

        # rebuilding the downstream view alone: it reads the live upstream generation
        runner.request_rebuild("revenue_by_city")
        assert catalog.building("order_lines") is None
        runner.run(until_caught_up=True, timeout=120)
        assert [catalog.current(n).generation for n in CHAIN] == [2, 3]
        _check_pair(dsn, catalog, together=False)
        with pytest.raises(ProjectionStateError, match="rebuilt whole"):
            runner.rebuild_part("order_lines", key_from="1")


def test_status_shows_each_view_input_and_its_lag(spark: Any, shop: CaptureConfig,
                                                  tmp_path: Path) -> None:
    dsn = shop.source_dsn
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.1)
    with Runner(spark, _registry(), config) as runner, Catalog(dsn) as catalog:
        runner.run(until_caught_up=True, timeout=120)
        _check_pair(dsn, catalog)
        with ChangelogStore(dsn) as store:
            heads = {s.name: s.head for s in store.streams()}
        statuses = {s.name: s for s in projection_status(catalog, dsn, list(CHAIN))}
        lines = statuses["order_lines"]
        assert lines.style == "view"
        assert {s.source: (s.position, s.head, s.lag_records) for s in lines.sources} == {
            f"{alias} (public.{alias})": (heads[f"public.{alias}"], heads[f"public.{alias}"], 0)
            for alias in ("orders", "customers", "products")}
        (upstream,) = statuses["revenue_by_city"].sources
        assert upstream.source == "lines (lakefold_views.order_lines_g1)"
        assert upstream.lag_records == 0 and upstream.head > 0
        # held back: the orders input lags by what the capture wrote since
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO orders VALUES (90, 1, 1, 5), (91, 2, 1, 6)")
        capture_now(shop)
        (lines,) = projection_status(catalog, dsn, ["order_lines"])
        lag = {s.source.split()[0]: s.lag_records for s in lines.sources}
        assert lag == {"orders": 2, "customers": 0, "products": 0}
        assert lines.lag_records == 2 and lines.lag_seconds >= 0
        # the view's reader holds the compaction of the stream where it stopped
        assert lines.holds_compaction["public.orders"] == heads["public.orders"]

    # as a user runs it: `lakefold status` lists the inputs; `lakefold rebuild` the chain
    env = {"LAKEFOLD_STORE_DSN": dsn, "LAKEFOLD_HOME": str(tmp_path)}
    status = CliRunner().invoke(app, ["status"], env=env)
    assert status.exit_code == 0, status.output
    assert "view inputs" in status.output and "orders (public.orders)" in status.output
    rebuilt = CliRunner().invoke(app, ["rebuild", "order_lines", "-p", VIEW_PROJECTIONS],
                                 env=env)
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "order_lines is now generation 2" in rebuilt.output
    with Catalog(dsn) as catalog:
        assert [catalog.current(n).generation for n in CHAIN] == [2, 2]
        _check_pair(dsn, catalog)
