"""``lakefold bench aggregates``: aggregates loaded and saved through the repository, against
the same domain written with the ``eventsourcing`` library on the same PostgreSQL.

One throwaway PostgreSQL (fsync on), one database per side. The domain: bank accounts,
``open`` then ``deposit`` commands.

- ``results.load_ms_p50`` / ``load_ms_with_snapshot_p50``: load an account of 1,000 events,
  deposit, save (``--rounds`` times, p50), without snapshots and with one every 100 events.
- ``results.commands_per_s``: ``--writers`` threads run deposit commands (load, act, save,
  again on a conflict) on random accounts of ``--accounts``; ``peers.eventsourcing_commands_per_s``
  the same with ``eventsourcing``'s ``Application`` and ``Aggregate`` (retrying its
  ``RecordConflictError``), and ``baseline.eventsourcing_commands_per_s`` too (the target is
  at least twice it). Both sides' final balances are checked against the commands that succeeded.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from lakefold._bench import bench_app
from lakefold._bench.report import BenchmarkError, Report
from lakefold.eventstore import Aggregate, EventStore, Repository, when
from lakefold.schemas import EventRegistry


class Opened(BaseModel):
    owner: str


class Deposited(BaseModel):
    amount: int


def _registry() -> EventRegistry:
    registry = EventRegistry()
    registry.add(Opened, name="bench_account.opened")
    registry.add(Deposited, name="bench_account.deposited")
    return registry


class Account(Aggregate):
    category = "account"

    def __init__(self, id: str) -> None:
        super().__init__(id)
        self.owner = ""
        self.balance = 0

    def deposit(self, amount: int) -> None:
        self.raise_event(Deposited(amount=amount))

    @when(Opened)
    def _opened(self, event: Opened) -> None:
        self.owner = event.owner

    @when(Deposited)
    def _deposited(self, event: Deposited) -> None:
        self.balance += event.amount


class _Ours:
    def __init__(self, dsn: str, writers: int) -> None:
        from lakefold.eventstore import StoreOptions

        self.store = EventStore(dsn, registry=_registry(),
                                options=StoreOptions(pool_size=writers + 2))
        self.store.install()

    def repository(self, snapshots: bool) -> Repository[Account]:
        return Repository(self.store, Account, snapshot_every=100 if snapshots else None)

    def open(self, ids: list[str]) -> None:
        repository = self.repository(False)
        for start in range(0, len(ids), 100):
            accounts = []
            for id_ in ids[start:start + 100]:
                account = Account(id_)
                account.raise_event(Opened(owner=f"owner {id_}"))
                accounts.append(account)
            repository.save(*accounts)

    def grow(self, id_: str, events: int, snapshots: bool) -> None:
        repository = self.repository(snapshots)
        account = repository.get(id_)
        for _ in range(events):
            account.deposit(1)
            if len(account.pending) == 100:
                repository.save(account)
        repository.save(account)

    def load_and_save(self, id_: str, snapshots: bool) -> None:
        repository = self.repository(snapshots)
        account = repository.get(id_)
        account.deposit(1)
        repository.save(account)

    def deposit(self, id_: str, amount: int) -> None:
        self.repository(False).update(id_, lambda a: a.deposit(amount), attempts=1000)

    def balance(self, id_: str) -> int:
        return self.repository(False).get(id_).balance

    def close(self) -> None:
        self.store.close()


class _Theirs:
    """The same domain in ``eventsourcing`` 9.5 (its ``Aggregate`` with ``@event``)."""

    def __init__(self, port: int, dbname: str, writers: int) -> None:
        from eventsourcing.application import Application
        from eventsourcing.domain import Aggregate as EsAggregate, event

        class EsAccount(EsAggregate):
            @event("Opened")
            def __init__(self, owner: str) -> None:
                self.owner = owner
                self.balance = 0

            @event("Deposited")
            def deposit(self, amount: int) -> None:
                self.balance += amount

        self.account_class = EsAccount
        self.app: Any = Application(env={
            "PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": dbname,
            "POSTGRES_HOST": "127.0.0.1", "POSTGRES_PORT": str(port),
            "POSTGRES_USER": "postgres", "POSTGRES_PASSWORD": "",
            "POSTGRES_POOL_SIZE": str(writers + 2), "POSTGRES_MAX_OVERFLOW": "10",
            "CREATE_TABLE": "yes"})
        if type(self.app.recorder).__module__ != "eventsourcing.postgres":
            raise BenchmarkError("the eventsourcing peer is not on PostgreSQL")
        self.ids: dict[str, Any] = {}

    def open(self, ids: list[str]) -> None:
        for id_ in ids:
            account = self.account_class(owner=f"owner {id_}")
            self.app.save(account)
            self.ids[id_] = account.id

    def deposit(self, id_: str, amount: int) -> None:
        from eventsourcing.persistence import RecordConflictError

        for _ in range(1000):
            account: Any = self.app.repository.get(self.ids[id_])
            account.deposit(amount)
            try:
                self.app.save(account)
                return
            except RecordConflictError:
                time.sleep(0.002 * random.random())  # noqa: S311 - jitter
        raise BenchmarkError(f"eventsourcing: account {id_} conflicted 1,000 times")

    def balance(self, id_: str) -> int:
        return int(self.app.repository.get(self.ids[id_]).balance)

    def close(self) -> None:
        self.app.close()


def _commands(side: _Ours | _Theirs, ids: list[str], writers: int, per_writer: int
              ) -> float:
    """Commands per second of ``writers`` threads; the balances are checked after."""
    done: dict[str, int] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)  # noqa: S311 - a reproducible workload
        try:
            for _ in range(per_writer):
                id_, amount = rng.choice(ids), rng.randrange(1, 100)
                side.deposit(id_, amount)
                with lock:
                    done[id_] = done.get(id_, 0) + amount
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(writers)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise BenchmarkError(f"a writer failed: {errors[0]!r}")
    for id_, amount in done.items():
        if side.balance(id_) != amount:
            raise BenchmarkError(f"{type(side).__name__}: account {id_} holds "
                                 f"{side.balance(id_)}, the commands deposited {amount}")
    return writers * per_writer / elapsed


def _p50_ms(action: Callable[[], None], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        action()
        times.append((time.perf_counter() - began) * 1000)
    return round(statistics.median(times), 2)


def run(accounts: int, writers: int, per_writer: int, rounds: int) -> Report:
    import psycopg
    from psycopg import sql

    from lakefold.local import LocalPostgres

    report = Report("aggregates", {"accounts": accounts, "writers": writers,
                                   "commands_per_writer": per_writer, "load_events": 1000,
                                   "snapshot_every": 100, "rounds": rounds, "fsync": True})
    with LocalPostgres(durable=True) as server:
        server.start()
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            for name in ("ours", "theirs"):
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        ids = [str(i) for i in range(accounts)]
        ours = _Ours(server.dsn("ours"), writers)
        theirs = _Theirs(server.port, "theirs", writers)
        try:
            ours.open([*ids, "long", "long-snapshots"])
            ours.grow("long", 999, snapshots=False)
            ours.grow("long-snapshots", 999, snapshots=True)
            report.results["load_ms_p50"] = _p50_ms(
                lambda: ours.load_and_save("long", False), rounds)
            report.results["load_ms_with_snapshot_p50"] = _p50_ms(
                lambda: ours.load_and_save("long-snapshots", True), rounds)
            theirs.open(ids)
            mine = _commands(ours, ids, writers, per_writer)
            peer = _commands(theirs, ids, writers, per_writer)
        finally:
            ours.close()
            theirs.close()
    report.results["commands_per_s"] = round(mine)
    report.baseline["eventsourcing_commands_per_s"] = round(peer)
    report.peers["eventsourcing_commands_per_s"] = round(peer)
    report.results["ratio_to_eventsourcing"] = round(mine / peer, 2)
    return report


@bench_app.command("aggregates")
def aggregates(
    accounts: Annotated[int, typer.Option(help="Accounts the writers pick from.")] = 1000,
    writers: Annotated[int, typer.Option(help="Concurrent writer threads.")] = 16,
    commands: Annotated[int, typer.Option(help="Commands per writer.")] = 200,
    rounds: Annotated[int, typer.Option(help="Load-and-save rounds for the p50s.")] = 30,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Aggregates: load-and-save with and without snapshots, and commands/s with concurrent
    writers, against the eventsourcing library on the same PostgreSQL."""
    run(accounts, writers, commands, rounds).emit(as_json=as_json)
