"""Aggregates and their repository, against the in-memory store and PostgreSQL alike (the
same tests, two fixtures): load, save, optimistic concurrency, atomic multi-aggregate saves,
upcasting on load, snapshots (interval, schema change, corruption), bad input; and 16 threads
running commands on 10 accounts with retries, checked against a sequential replay."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from lakefold.eventstore import (
    Aggregate,
    AggregateError,
    AggregateNotFoundError,
    EventStore,
    Repository,
    WrongExpectedVersionError,
    when,
)
from lakefold.schemas import NewEvent
from lakefold.schemas.exceptions import UnknownEventTypeError
from tests.eventstore.aggregate_domain import (
    Account,
    Deposited,
    InsufficientFunds,
    RenamableAccount,
    registry,
)
from tests.fixtures.postgres import TestDatabase


@pytest.fixture(params=["memory", "postgres"])
def store(request: pytest.FixtureRequest) -> Iterator[EventStore]:
    if request.param == "memory":
        yield EventStore.in_memory(registry=registry())
        return
    pg: TestDatabase = request.getfixturevalue("pg")
    with EventStore(pg.dsn, registry=registry()) as postgres:
        postgres.install()
        yield postgres


def test_an_aggregate_is_the_fold_of_its_stream(store: EventStore) -> None:
    accounts = Repository(store, Account)
    account = Account.open("1", "ada")
    account.deposit(50)
    account.withdraw(20)
    assert (account.version, account.saved_version, len(account.pending)) == (3, 0, 3)
    accounts.save(account)
    assert (account.version, account.pending) == (3, ())
    loaded = accounts.get("1")
    assert (loaded.owner, loaded.balance, loaded.movements, loaded.version) == ("ada", 30, 2, 3)
    assert [e.type for e in store.read_stream("account-1")] == [
        "account.opened", "account.deposited", "account.withdrawn"]
    # an event stored at an older version (by older code: no registry) is upcast before its
    # handler sees it
    EventStore.from_recorder(store.recorder).append("account-1", [NewEvent(
        type="account.deposited", data={"cents": 5}, schema_version=1)])
    assert accounts.get("1").balance == 35
    with pytest.raises(AggregateNotFoundError, match="account-2"):
        accounts.get("2")


def test_a_stale_save_is_refused_and_a_retried_command_wins(store: EventStore) -> None:
    accounts = Repository(store, Account)
    accounts.save(Account.open("1", "ada"))
    first, second = accounts.get("1"), accounts.get("1")
    first.deposit(10)
    accounts.save(first)
    second.deposit(99)
    with pytest.raises(WrongExpectedVersionError) as caught:
        accounts.save(second)
    assert (caught.value.stream_id, caught.value.actual_version) == ("account-1", 2)
    assert "account-1" in str(caught.value) and "version 2" in str(caught.value)
    assert accounts.get("1").balance == 10  # nothing of the stale save
    accounts.update("1", lambda a: a.deposit(99))
    assert accounts.get("1").balance == 109
    # a new aggregate whose stream exists already is a conflict too
    with pytest.raises(WrongExpectedVersionError):
        accounts.save(Account.open("1", "eve"))


def test_several_aggregates_save_together_or_not_at_all(store: EventStore) -> None:
    accounts = Repository(store, Account)
    accounts.save(Account.open("a", "ada"), Account.open("b", "bob"))
    source, target = accounts.get("a"), accounts.get("b")
    source.deposit(100)
    accounts.save(source)
    source, target = accounts.get("a"), accounts.get("b")
    source.withdraw(40)
    target.deposit(40)
    stale = accounts.get("b")
    stale.deposit(1)
    accounts.save(stale)  # the target moves on: the transfer's save must fail whole
    with pytest.raises(WrongExpectedVersionError):
        accounts.save(source, target)
    assert (accounts.get("a").balance, accounts.get("b").balance) == (100, 1)
    accounts.save(accounts.get("a"))  # nothing pending: nothing written
    assert store.stream_state("account-a").version == 2


def test_commands_that_fail_leave_nothing_to_save(store: EventStore) -> None:
    accounts = Repository(store, RenamableAccount)
    account = RenamableAccount.open("1", "ada")
    with pytest.raises(InsufficientFunds):
        account.withdraw(5)
    with pytest.raises(ValueError, match="positive"):
        account.deposit(0)
    assert len(account.pending) == 1
    accounts.save(account)
    account.rename("eve")  # an event class no registry knows
    with pytest.raises(UnknownEventTypeError, match="Renamed"):
        accounts.save(account)
    assert store.stream_state("account-1").version == 1


def test_bad_definitions_are_refused(store: EventStore) -> None:
    with pytest.raises(AggregateError, match="no category"):
        class NoCategory(Aggregate):
            pass
        NoCategory("1")
    with pytest.raises(AggregateError, match="category"):
        class BadCategory(Aggregate):
            category = "has-dash"

    class Silent(Aggregate):
        category = "silent"

    with pytest.raises(AggregateError, match=r"no @when\(Deposited\) handler"):
        Silent("1").raise_event(Deposited(amount=1))
    with pytest.raises(AggregateError, match="@when takes an event model class"):
        when("Deposited")  # type: ignore[arg-type]
    with pytest.raises(AggregateError, match="registry"):
        Repository(EventStore.in_memory(), Account)
    with pytest.raises(AggregateError, match="snapshot_every"):
        Repository(store, Account, snapshot_every=0)


def _deposits(accounts: Repository[Account], id: str, amounts: list[int]) -> None:
    for amount in amounts:
        account = accounts.get(id)
        account.deposit(amount)
        accounts.save(account)


def test_snapshots_every_n_events_load_the_same_state(
        store: EventStore, caplog: pytest.LogCaptureFixture) -> None:
    plain = Repository(store, Account)
    snapshotting = Repository(store, Account, snapshot_every=5)
    assert snapshotting.snapshots is not None
    snapshotting.save(Account.open("1", "ada"))
    _deposits(snapshotting, "1", list(range(1, 13)))  # versions 2..13: snapshots at 5, 10
    snapshot = snapshotting.snapshots.load("account-1")
    assert snapshot is not None and snapshot.version == 10
    expected = vars(plain.get("1"))
    assert vars(snapshotting.get("1")) == expected

    # an older snapshot version of the class is passed over
    Account.snapshot_version = 2
    try:
        with caplog.at_level(logging.INFO):
            assert vars(snapshotting.get("1")) == expected
        assert "passing over the snapshot of account-1" in caplog.text
    finally:
        Account.snapshot_version = 1

    # a snapshot that does not restore: a warning, then the events
    snapshotting.snapshots.save(type(snapshot)(
        snapshot.stream_id, snapshot.aggregate, snapshot.schema_version, 11, "[1, 2]"))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert vars(snapshotting.get("1")) == expected
    assert "does not restore" in caplog.text


def test_a_snapshot_restores_without_replaying_what_it_covers(store: EventStore) -> None:
    accounts = Repository(store, Account, snapshot_every=3)
    accounts.save(Account.open("1", "ada"))
    _deposits(accounts, "1", [1, 2])  # version 3: a snapshot
    assert accounts.snapshots is not None
    snapshot = accounts.snapshots.load("account-1")
    assert snapshot is not None and snapshot.version == 3
    # a snapshot state that differs from the events shows that the load started from it
    doctored = type(snapshot)(snapshot.stream_id, snapshot.aggregate,
                              snapshot.schema_version, 4,
                              '{"owner": "ada", "balance": 1000, "movements": 2}')
    accounts.snapshots.save(doctored)
    _deposits(Repository(store, Account), "1", [5])  # version 4 in the stream
    _deposits(Repository(store, Account), "1", [7])  # version 5: after the snapshot
    loaded = accounts.get("1")
    assert (loaded.balance, loaded.version, loaded.movements) == (1007, 5, 3)


def test_save_in_the_callers_transaction_with_its_own_sql(pg: TestDatabase) -> None:
    with EventStore(pg.dsn, registry=registry()) as store:
        store.install()
        accounts = Repository(store, Account, snapshot_every=1)
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE audit (stream text, note text)")
        with store.transaction() as unit:
            account = Account.open("1", "ada")
            accounts.save(account, unit=unit)
            unit.connection.execute("INSERT INTO audit VALUES ('account-1', 'opened')")
        with pytest.raises(RuntimeError), store.transaction() as unit:
            account = accounts.get("1")
            account.deposit(5)
            accounts.save(account, unit=unit)
            raise RuntimeError("the handler fails after saving: nothing is kept")
        assert accounts.get("1").balance == 0
        assert store.stream_state("account-1").version == 1
        with psycopg.connect(pg.dsn) as conn:
            assert conn.execute("SELECT count(*) FROM audit").fetchone() == (1,)
            assert conn.execute("SELECT version FROM lakefold.aggregate_snapshots").fetchone() \
                == (1,)


def test_16_writers_on_10_accounts_equal_a_sequential_replay(pg: TestDatabase) -> None:
    with EventStore(pg.dsn, registry=registry()) as store:
        store.install()
        accounts = Repository(store, Account, snapshot_every=7)
        ids = [str(i) for i in range(10)]
        accounts.save(*(Account.open(i, f"owner {i}") for i in ids))
        done: list[tuple[str, str, int]] = []
        lock = threading.Lock()
        errors: list[BaseException] = []

        def writer(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for _ in range(25):
                    id_, amount = rng.choice(ids), rng.randrange(1, 100)
                    kind = "deposit" if rng.random() < 0.7 else "withdraw"

                    def command(account: Any, kind: str = kind, amount: int = amount) -> None:
                        getattr(account, kind)(amount)
                    try:
                        accounts.update(id_, command, attempts=200)
                    except InsufficientFunds:
                        continue
                    with lock:
                        done.append((id_, kind, amount))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        for id_ in ids:
            events = store.read_stream(f"account-{id_}")[1:]
            mine = [(kind, amount) for i, kind, amount in done if i == id_]
            # no command lost or doubled: the stream holds each successful command once
            kinds = {"account.deposited": "deposit", "account.withdrawn": "withdraw"}
            assert sorted((kinds[e.type], e.event.amount) for e in events) == sorted(mine)
            # the state equals a sequential replay of the stream, snapshot or not
            balance = 0
            for event in events:
                balance += event.event.amount if event.type == "account.deposited" else \
                    -event.event.amount
                assert balance >= 0  # no withdrawal ever overdrew: commands saw fresh state
            assert accounts.get(id_).balance == balance == \
                Repository(store, Account).get(id_).balance
