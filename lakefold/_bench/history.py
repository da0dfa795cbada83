"""The event history that ``lakefold bench replay`` and ``lakefold bench rebuild`` share.

``--events`` deposits (``account.deposited``: ``{"customer": "c<i mod customers>", "amount":
i mod 100}``, event ``i`` counted from 0) in streams ``acct-<k>`` of ``per_stream`` events each,
appended through the public ``EventStore.append_streams`` in big batches. The store is a
throwaway, durable PostgreSQL, or with ``store_dsn`` an existing one: an empty event store there
is loaded, and one that already holds exactly this many events is reused as it is (so the two
benchmarks can share one load of a long history; each checks its result against the expected
aggregate, which a different history would fail).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from pydantic import BaseModel

from lakefold._bench.report import BenchmarkError, Report
from lakefold.schemas import EventRegistry

registry = EventRegistry()


@registry.event("account.deposited")
class Deposited(BaseModel):
    """The history's one event type (Spark workers import this module for typed payloads)."""

    customer: str
    amount: int


#: Import path of ``registry`` (the ``registry`` option of the ``lakefold_events`` source).
REGISTRY_PATH = "lakefold._bench.history:registry"
CATEGORY = "acct"
DEFAULT_PER_STREAM = 1_000
DEFAULT_CUSTOMERS = 1_000
#: The benches' ``--store-dsn`` option.
StoreDsnOption = Annotated[str | None, typer.Option(
    help="Use this PostgreSQL instead of a throwaway one: an empty event store there is "
         "loaded, one holding exactly --events events of this history (e.g. loaded by the "
         "other bench) is reused.")]
_APPEND = 10_000  # events per append_streams call: one round trip, one COPY


def deposit(i: int, customers: int) -> Deposited:
    """Event ``i`` of the history."""
    return Deposited(customer=f"c{i % customers}", amount=i % 100)


def load_history(dsn: str, events: int, *, per_stream: int, customers: int) -> int:
    """Append the history through the EventStore API; return the store's head."""
    from lakefold.eventstore import NO_STREAM, EventStore, StreamEvents

    with EventStore(dsn, registry=registry) as store:
        store.install()
        written = 0
        stream = 0
        while written < events:
            group: list[StreamEvents] = []
            batch = 0
            while written < events and batch < _APPEND:
                count = min(per_stream, events - written)
                group.append(StreamEvents(
                    f"{CATEGORY}-{stream}",
                    [deposit(written + i, customers) for i in range(count)], NO_STREAM))
                written += count
                batch += count
                stream += 1
            store.append_streams(group)
        return int(store.head())


def _existing_head(dsn: str) -> int:
    from lakefold.eventstore import EventStore

    with EventStore(dsn, registry=registry) as store:
        store.install()
        return int(store.head())


def _prepare(report: Report, dsn: str, events: int, per_stream: int, customers: int) -> None:
    import psycopg

    head = _existing_head(dsn)
    if head == 0:
        began = time.perf_counter()
        head = load_history(dsn, events, per_stream=per_stream, customers=customers)
        report.params["load_events_per_s"] = round(events / (time.perf_counter() - began))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")  # what autovacuum does soon after a bulk load
    if head != events:
        raise BenchmarkError(f"the store holds {head} events, the benchmark wants {events}; "
                            "use an empty store (or one loaded by this benchmark at this size)")
    # The store's background sealer follows the load, and stops with it: what it had not
    # sealed yet is sealed now, as a running store would soon after (a no-op on a reused one).
    from lakefold.eventstore import EventStore

    with EventStore(dsn) as store:
        report.params["segments_sealed_before_reading"] = store.seal().segments


@contextmanager
def history_store(report: Report, *, events: int, per_stream: int, customers: int,
                  store_dsn: str | None = None) -> Iterator[str]:
    """A store holding the history (see the module docstring); yields its DSN."""
    if store_dsn is not None:
        _prepare(report, store_dsn, events, per_stream, customers)
        yield store_dsn
        return
    from lakefold.local import LocalPostgres

    with LocalPostgres(durable=True) as server:
        server.start()
        dsn = server.dsn()
        _prepare(report, dsn, events, per_stream, customers)
        yield dsn
