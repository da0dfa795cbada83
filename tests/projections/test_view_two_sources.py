"""A view joining a table of each of two source databases (two PostgreSQL servers, two
captures, one store), end to end: after both sources are quiet and caught up, the view's Delta
table equals the join computed on the sources' rows; and while they change, every version the
target commits holds each of source A's transactions whole (transfers keep A's sum constant).
Between the two sources there is no common commit order: an intermediate version may combine
A at one time with B at another, which is why only A's own invariant is checked there."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from lakefold.capture import CaptureConfig
from lakefold.projections import Runner, RunnerConfig
from lakefold.projections.definitions._api import Registry, registering_into, view
from lakefold.projections.definitions._model import changelog
from lakefold.projections.definitions._target_specs import delta_table
from lakefold.projections.operations import Catalog, SinkRoots
from tests.capture.conftest import capture_now, execute, running_capture
from tests.capture.two_sources import TwoSources, second_server, sources

__all__ = ["second_server", "sources"]  # fixtures, used by name
pytestmark = pytest.mark.timeout(600)

ACCOUNTS = 6
TOTAL = 100 * ACCOUNTS  # A's transactions move money, never make or lose it
OWNERS = range(1, 9)
QUERY = """SELECT a.id, a.balance, o.name AS owner
           FROM accounts a LEFT JOIN owners o ON o.id = a.owner_id"""


def _registry() -> Registry:
    registry = Registry()
    with registering_into(registry):
        view("balances", key=["id"], query=QUERY,
             inputs={"accounts": changelog("public.accounts"),  # source A, no prefix
                     "owners": changelog("b.public.owners")},   # source B, prefix b.
             target=delta_table("upsert", keys=["id"]))
    return registry


def _a_transaction(conn: psycopg.Connection[Any], rng: random.Random, next_id: list[int]) -> None:
    """One transaction on A: a transfer between two accounts (two rows move together), an
    account opened with nothing, an account closed into another (its balance moved, then it is
    deleted), or an account given another owner."""
    ids = [r[0] for r in conn.execute("SELECT id FROM accounts ORDER BY id")]
    kind = rng.choices(["transfer", "open", "close", "owner"], [6, 1, 1, 1])[0]
    with conn.transaction():
        if kind == "open" or len(ids) < 3:
            conn.execute("INSERT INTO accounts VALUES (%s, %s, 0)",
                         (next_id[0], rng.choice(OWNERS)))
            next_id[0] += 1
        elif kind == "owner":
            conn.execute("UPDATE accounts SET owner_id = %s WHERE id = %s",
                         (rng.choice(OWNERS), rng.choice(ids)))
        else:
            source, sink = rng.sample(ids, 2)
            amount = rng.randint(1, 60)
            conn.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s",
                         (amount, source))
            conn.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s",
                         (amount, sink))
            if kind == "close":
                conn.execute("UPDATE accounts SET balance = balance + (SELECT balance FROM "
                             "accounts WHERE id = %s) WHERE id = %s", (source, sink))
                conn.execute("DELETE FROM accounts WHERE id = %s", (source,))


def _b_transaction(conn: psycopg.Connection[Any], rng: random.Random) -> None:
    """One transaction on B: an owner added, renamed or removed."""
    owner = rng.choice(OWNERS)
    name = f"owner-{owner}-{rng.randint(0, 999)}"
    with conn.transaction():
        match rng.choice(["upsert", "upsert", "delete"]):
            case "upsert":
                conn.execute("INSERT INTO owners VALUES (%s, %s) ON CONFLICT (id) DO UPDATE "
                             "SET name = excluded.name", (owner, name))
            case _:
                conn.execute("DELETE FROM owners WHERE id = %s", (owner,))


def _workload(sources: TwoSources, seed: int, next_id: list[int], errors: list[BaseException],
              *, transactions: int = 60) -> None:
    rng = random.Random(seed)
    try:
        with psycopg.connect(sources.a, autocommit=True) as a, \
                psycopg.connect(sources.b, autocommit=True) as b:
            for _ in range(transactions):
                if rng.random() < 0.7:
                    _a_transaction(a, rng, next_id)
                else:
                    _b_transaction(b, rng)
                time.sleep(0.03)  # the captures and the view cut between transactions
    except BaseException as e:  # reported by the test
        errors.append(e)


def _oracle(sources: TwoSources) -> dict[int, tuple[int, str | None]]:
    """The view computed on the sources' rows, read once both are quiet."""
    with psycopg.connect(sources.a) as a, psycopg.connect(sources.b) as b:
        owners: dict[int, str] = dict(b.execute("SELECT id, name FROM owners").fetchall())
        return {int(i): (int(balance), owners.get(owner))
                for i, owner, balance in a.execute("SELECT id, owner_id, balance FROM accounts")}


def _delta_rows(path: str, version: int | None = None) -> dict[int, tuple[int, str | None]]:
    table = DeltaTable(path, version=version).to_pyarrow_table()
    return {r["id"]: (r["balance"], r["owner"]) for r in table.to_pylist()}


def test_a_view_joining_two_sources_equals_the_join_once_quiet_and_keeps_each_transaction(
        spark: Any, sources: TwoSources, tmp_path: Path) -> None:
    execute(sources.a, "CREATE TABLE accounts (id int PRIMARY KEY, owner_id int NOT NULL, "
            "balance bigint NOT NULL)")
    execute(sources.a, "INSERT INTO accounts SELECT g, g, 100 FROM generate_series(1, %s) g",
            params=(ACCOUNTS,))
    execute(sources.b, "CREATE TABLE owners (id int PRIMARY KEY, name text NOT NULL)",
            "INSERT INTO owners SELECT g, 'owner-' || g FROM generate_series(1, 4) g")
    config_a = CaptureConfig(source_dsn=sources.a, store_dsn=sources.store, slot="lakefold_a",
                             tables=("public.accounts",))
    config_b = CaptureConfig(source_dsn=sources.b, store_dsn=sources.store, slot="lakefold_b",
                             tables=("public.owners",), stream_prefix="b.")
    for config in (config_a, config_b):
        capture_now(config)
    runner_config = RunnerConfig(store_dsn=sources.store, roots=SinkRoots.under(tmp_path),
                                 poll_seconds=0.1)
    next_id = [ACCOUNTS + 1]
    with Catalog(sources.store) as catalog, \
            Runner(spark, _registry(), runner_config) as runner:
        runner.run(until_caught_up=True, timeout=180)
        path = catalog.current("balances").location("delta")
        assert _delta_rows(path) == _oracle(sources)
        for round_ in range(3):
            seed = 1000 + round_
            # both captures and the workload run while the view runs batch after batch
            captures = [running_capture(config) for config in (config_a, config_b)]
            errors: list[BaseException] = []
            work = threading.Thread(target=_workload, args=(sources, seed, next_id, errors))
            work.start()
            while work.is_alive():
                runner.run(until_caught_up=True, timeout=120)
            work.join()
            for stop, thread, capture_errors in captures:
                stop.set()
                thread.join(60)
                errors.extend(capture_errors)
            assert not errors, (seed, errors)
            for config in (config_a, config_b):  # caught up with both sources, now quiet
                capture_now(config)
            runner.run(until_caught_up=True, timeout=180)
            assert _delta_rows(path) == _oracle(sources), f"round {round_}, seed {seed}"

        # every version the target committed: A's rows hold A's whole transactions
        versions = DeltaTable(path).version()
        assert versions >= 6  # batches cut while both sources changed
        for version in range(versions + 1):
            rows = _delta_rows(path, version)
            if rows:
                assert sum(balance for balance, _ in rows.values()) == TOTAL, version
