"""A chain of views shows only states the source had: a view that joins a table with another
view's output cuts the table at the source commit the other view's output reflects, so every
version of its output (every batch it writes) is the source at one commit.

The source keeps an invariant in every transaction: an account exists exactly while it has
entries (an account and its entries are created together, and deleted together). The
downstream view full-joins the accounts with a view of entries per account; a row with an
account but no entries (or entries but no account) is a state the source never had. The
capture runs between the upstream view's batch and the downstream one's, so the table's head
is always ahead of what the upstream view has applied."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings, strategies as st

from lakefold.capture import Capture, CaptureConfig
from lakefold.projections import Runner, RunnerConfig
from lakefold.projections.definitions._api import Registry, registering_into, view
from lakefold.projections.definitions._model import changelog
from lakefold.projections.definitions._target_specs import delta_table
from lakefold.projections.operations import Catalog, SinkRoots
from lakefold.projections.operators._view_core import output_stream
from lakefold.projections.operators._view_maintainer import ViewMaintainer, open_view
from tests.capture.conftest import capture_now, execute
from tests.fixtures.postgres import TestDatabase
from tests.projections.view_shop import (
    CITY_SIZES,
    LATER_ORDERS,
    ORACLE,
    ORDERS_PER_CUSTOMER_HISTOGRAM,
    SAME_CITY,
    TOTALS,
    keyed,
    oracle,
)

pytestmark = pytest.mark.timeout(600)

PER_ACCOUNT = "SELECT account, count(*) AS entries, sum(amount) AS total FROM e GROUP BY account"
# not an aggregate kept by its changes (an expression): recomputed by partitions
PER_ACCOUNT_RECOMPUTED = PER_ACCOUNT.replace("sum(amount)", "sum(amount + 0)")
BOTH = """
    SELECT coalesce(a.id, p.account) AS id, a.name, p.entries, p.total
    FROM a FULL OUTER JOIN p ON a.id = p.account"""


@pytest.fixture
def ledger(pg: TestDatabase) -> CaptureConfig:
    execute(pg.dsn, "CREATE TABLE accounts (id int PRIMARY KEY, name text NOT NULL)",
            "CREATE TABLE entries (id int PRIMARY KEY, account int NOT NULL, amount int)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("accounts", "entries"), slot="chains")
    Capture(config).setup()
    return config


def _open(spark: Any, dsn: str, generation: int, query: str) -> tuple[ViewMaintainer,
                                                                       ViewMaintainer]:
    upstream = open_view(spark, dsn, view="per_account", generation=generation,
                         inputs={"e": "public.entries"}, query=query, key=["account"])
    downstream = open_view(spark, dsn, view="both", generation=generation,
                           inputs={"a": "public.accounts",
                                   "p": output_stream("per_account", generation)},
                           query=BOTH, key=["id"])
    return upstream, downstream


def _transaction(conn: psycopg.Connection[Any], rng: random.Random, ids: list[int]) -> None:
    """One transaction that keeps the invariant: a new account with entries, more entries of
    an account, or an account deleted with its entries."""
    with conn.transaction():
        choice = rng.random()
        existing = [r[0] for r in conn.execute("SELECT id FROM accounts")]
        if choice < 0.5 or not existing:
            account = ids[0] = ids[0] + 1
            conn.execute("INSERT INTO accounts VALUES (%s, %s)", (account, f"a{account}"))
            for _ in range(rng.randint(1, 3)):
                ids[1] += 1
                conn.execute("INSERT INTO entries VALUES (%s, %s, %s)",
                             (ids[1], account, rng.randint(1, 100)))
        elif choice < 0.8:
            ids[1] += 1
            conn.execute("INSERT INTO entries VALUES (%s, %s, %s)",
                         (ids[1], rng.choice(existing), rng.randint(1, 100)))
        else:
            account = rng.choice(existing)
            conn.execute("DELETE FROM entries WHERE account = %s", (account,))
            conn.execute("DELETE FROM accounts WHERE id = %s", (account,))


def _rows(view: ViewMaintainer) -> list[dict[str, Any]]:
    store = view.connection()
    typed = view.own.typed(store, view.own.rows(store))
    rows: list[dict[str, Any]] = typed.drop_columns(
        [c for c in typed.column_names if c.startswith("_")]).to_pylist()
    return rows


GENERATION = iter(range(1, 10_000))


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**16), rounds=st.integers(3, 8),
       recomputed=st.booleans())
def test_every_batch_of_a_chained_view_is_the_source_at_one_commit(
        spark: Any, ledger: CaptureConfig, seed: int, rounds: int, recomputed: bool) -> None:
    dsn = ledger.source_dsn
    with psycopg.connect(dsn) as conn:  # the tables outlive one example
        top = conn.execute("SELECT (SELECT coalesce(max(id), 0) FROM accounts), "
                           "(SELECT coalesce(max(id), 0) FROM entries)").fetchone()
    assert top is not None
    rng, ids = random.Random(seed), [int(top[0]), int(top[1])]
    upstream, downstream = _open(spark, dsn, next(GENERATION),
                                 PER_ACCOUNT_RECOMPUTED if recomputed else PER_ACCOUNT)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(rounds):
                for _ in range(rng.randint(1, 4)):
                    _transaction(conn, rng, ids)
                capture_now(ledger)
                upstream.step()
                for _ in range(rng.randint(1, 4)):  # the tables move on before the join's batch
                    _transaction(conn, rng, ids)
                capture_now(ledger)
                downstream.step()
                rows = _rows(downstream)
                broken = [r for r in rows if r["name"] is None or r["entries"] is None]
                assert not broken, broken
            # once both caught up, the join equals the source
            upstream.step()
            downstream.step()
            expected = {(i, n, c, t) for i, n, c, t in conn.execute(
                "SELECT a.id, a.name, count(*), sum(e.amount) FROM accounts a "
                "JOIN entries e ON e.account = a.id GROUP BY a.id, a.name")}
        assert {(r["id"], r["name"], r["entries"], r["total"])
                for r in _rows(downstream)} == expected
    finally:
        upstream.close()
        downstream.close()


def _shop_registry() -> Registry:
    """Self-joins, a chain over one, a global aggregate and an aggregate of an aggregate, as
    a user declares them (``view_shop`` has their SQL on the source)."""
    customers, orders = changelog("public.customers"), changelog("public.orders")
    registry = Registry()
    with registering_into(registry):
        same = view("same_city", inputs={"a": customers, "b": customers}, key="id",
                    query=SAME_CITY, target=delta_table("upsert", keys=["id"]))
        view("city_sizes", inputs={"s": same}, key="same_city", query=CITY_SIZES,
             target=delta_table("upsert", keys=["same_city"]))
        view("later_orders", inputs={"a": orders, "b": orders}, key=["first", "later"],
             query=LATER_ORDERS, target=delta_table("upsert", keys=["first", "later"]))
        view("totals", inputs={"orders": orders}, key="k", query=TOTALS,
             target=delta_table("upsert", keys=["k"]))
        view("histogram", inputs={"orders": orders}, key="n",
             query=ORDERS_PER_CUSTOMER_HISTOGRAM, target=delta_table("upsert", keys=["n"]))
    return registry


def _delta_rows(catalog: Catalog, name: str) -> dict[Any, dict[str, Any]]:
    key, _ = ORACLE[name]
    location = Path(catalog.current(name).location("delta"))
    if not (location / "_delta_log").exists():  # nothing written yet
        return {}
    rows = DeltaTable(location).to_pyarrow_table().to_pylist()
    return keyed([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows], key)


def test_self_joins_chains_and_global_aggregates_run_and_rebuild_to_the_source(
        spark: Any, shop: CaptureConfig, tmp_path: Path) -> None:
    dsn = shop.source_dsn
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.05)
    rng = random.Random(7)
    names = ("same_city", "city_sizes", "later_orders", "totals", "histogram")

    def check() -> None:
        with Catalog(dsn) as catalog:
            for name in names:
                assert _delta_rows(catalog, name) == oracle(dsn, name), name

    with Runner(spark, _shop_registry(), config) as runner:
        for round_ in range(4):
            with psycopg.connect(dsn) as conn, conn.transaction():
                conn.execute("INSERT INTO customers VALUES (%s, 'n', %s)",
                             (100 + round_, rng.choice(("Oslo", "Lima", None))))
                conn.execute("UPDATE customers SET city = %s WHERE id = %s",
                             (rng.choice(("Oslo", "Lima", "Pune")), rng.randrange(1, 7)))
                conn.execute("UPDATE customers SET id = %s WHERE id = %s",
                             (200 + round_, rng.randrange(1, 7)))
                conn.execute("INSERT INTO orders VALUES (%s, %s, 1, %s)",
                             (100 + round_, rng.randrange(1, 7), rng.randrange(1, 999)))
                conn.execute("UPDATE orders SET customer_id = %s WHERE id = %s",
                             (rng.randrange(1, 7), rng.randrange(1, 16)))
                conn.execute("DELETE FROM orders WHERE id = %s", (rng.randrange(1, 16),))
            if round_ == 2:
                execute(dsn, "TRUNCATE orders")
            capture_now(shop)
            runner.run(until_caught_up=True, timeout=120)
            check()
        for name in ("same_city", "later_orders", "totals", "histogram"):
            runner.request_rebuild(name)
        runner.run(until_caught_up=True, timeout=240)
    with Catalog(dsn) as catalog:
        assert {n: catalog.current(n).generation for n in names} == dict.fromkeys(names, 2)
    check()
