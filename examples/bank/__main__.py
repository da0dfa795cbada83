"""``python -m examples.bank``: open accounts, deposit, transfer (both accounts and an audit
row in one transaction; a transfer larger than the balance is refused and writes nothing),
then keep the ``balances`` view over the events and check it against the aggregates.

Runs against ``LAKEFOLD_DSN`` if set (a database you own: it installs the event store
there), else a throwaway embedded PostgreSQL.
"""

from __future__ import annotations

import os
import random
import tempfile
import uuid
from contextlib import ExitStack
from pathlib import Path

import psycopg
from deltalake import DeltaTable

from examples.bank.domain import Bank, InsufficientFunds, registry
from lakefold import EventStore, LocalPostgres, Runner, RunnerConfig, spark_session
from lakefold.projections import load_projections
from lakefold.projections.operations import Catalog, SinkRoots


def main() -> None:
    with ExitStack() as stack:
        dsn = os.environ.get("LAKEFOLD_DSN")
        if not dsn:
            server = stack.enter_context(LocalPostgres(Path(tempfile.mkdtemp()) / "pg"))
            server.start()
            dsn = server.dsn()
        store = stack.enter_context(EventStore(dsn, registry=registry))
        store.install()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS transfers "
                         "(source text, target text, amount int)")
        bank = Bank(store)
        rng = random.Random(1)  # noqa: S311 - a repeatable workload
        ids = [uuid.uuid4().hex[:8] for _ in range(5)]  # new accounts at every run
        for id_ in ids:
            bank.open(id_, f"owner of {id_}")
            bank.deposit(id_, 10_000)
        refused = 0
        for _ in range(60):
            source, target = rng.sample(ids, 2)
            try:
                bank.transfer(source, target, rng.randrange(1, 6_000))
            except InsufficientFunds:
                refused += 1
        print(f"5 accounts, 60 transfers ({refused} refused: insufficient funds)")
        for id_ in ids:
            print(f"  account {id_}: {bank.balance(id_):>6} cents")

        home = Path(os.environ.get("LAKEFOLD_HOME", ".lakefold")) / "bank"  # Delta tables
        spark = spark_session()
        config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(home))
        with Runner(spark, load_projections("examples/bank/projections.py"), config) as runner:
            runner.run(until_caught_up=True, timeout=300)
        with Catalog(dsn) as catalog:
            rows = DeltaTable(catalog.current("balances").location("delta")) \
                .to_pyarrow_table().to_pylist()
        aggregates = {f"account-{id_}": bank.balance(id_) for id_ in ids}
        view = {row["account"]: row["balance"] for row in rows if row["account"] in aggregates}
        if view != aggregates:
            raise SystemExit(f"the balances view {view} differs from the aggregates {aggregates}")
        print("the balances view equals the aggregates")


if __name__ == "__main__":
    main()
