"""The repository of an aggregate class: load from a stream (or from its latest snapshot and the
events after it), save pending events with optimistic concurrency, retry commands on conflict.

    accounts = Repository(store, Account, snapshot_every=100)
    account = accounts.get("42")               # AggregateNotFoundError if it has no events
    account.deposit(10)
    accounts.save(account)                     # WrongExpectedVersionError if someone saved first

    accounts.update("42", lambda a: a.deposit(10))   # load, command, save; retried on conflict
    accounts.save(source, target)              # several aggregates in one transaction
    with store.transaction() as unit:          # your own SQL in the same transaction
        accounts.save(account, unit=unit)
        unit.connection.execute("INSERT INTO audit ...")

A save appends each aggregate's pending events expecting the version it was loaded at
(``NO_STREAM`` for a new one), all streams in one transaction: every expectation holds and
every event is stored, or nothing is and ``WrongExpectedVersionError`` names the stream, the
expected and the actual version. ``retry`` and ``update`` run the command again on a fresh
load after such a conflict.

Snapshots (``snapshot_every=N``): after a save that takes an aggregate's version past a
multiple of N, its ``snapshot_state()`` is stored beside its stream (one per stream, the
newest wins) with the class's ``snapshot_version``. A load starts from the snapshot only if
it is of the same class and ``snapshot_version``; any other, or one that fails to restore, is
passed over with a warning and the aggregate replays its whole stream. A snapshot is an
optimisation: failing to write one never fails a save.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

import psycopg

from lakefold.core import migrations
from lakefold.core.migrations import Migration
from lakefold.eventstore._aggregates import Aggregate, AggregateError
from lakefold.eventstore._memory import InMemoryRecorder
from lakefold.eventstore._model import NO_STREAM, AppendResult
from lakefold.eventstore._postgres import PostgresRecorder
from lakefold.eventstore._store import EventStore, StreamEvents, UnitOfWork
from lakefold.eventstore.exceptions import EventStoreError, WrongExpectedVersionError
from lakefold.schemas.events import STREAM_DELETED_TYPE

log = logging.getLogger(__name__)

A = TypeVar("A", bound=Aggregate)
T = TypeVar("T")


class AggregateNotFoundError(AggregateError):
    """No aggregate has this id: its stream has no events, or it was deleted."""


@dataclass(frozen=True)
class Snapshot:
    """An aggregate's state at a version of its stream."""

    stream_id: str
    aggregate: str  # the class's qualified name
    schema_version: int  # its snapshot_version
    version: int
    state: str  # JSON


class SnapshotStore(Protocol):
    def load(self, stream_id: str) -> Snapshot | None: ...

    def save(self, snapshot: Snapshot, unit: UnitOfWork | None = None) -> None: ...


class InMemorySnapshots:
    """Snapshots in this process (beside ``EventStore.in_memory()``)."""

    def __init__(self) -> None:
        self._by_stream: dict[str, Snapshot] = {}
        self._lock = threading.Lock()

    def load(self, stream_id: str) -> Snapshot | None:
        return self._by_stream.get(stream_id)

    def save(self, snapshot: Snapshot, unit: UnitOfWork | None = None) -> None:
        with self._lock:
            known = self._by_stream.get(snapshot.stream_id)
            if known is None or known.version < snapshot.version:
                self._by_stream[snapshot.stream_id] = snapshot


_DDL: Final = """CREATE TABLE IF NOT EXISTS lakefold.aggregate_snapshots (
    stream_id text PRIMARY KEY,
    aggregate text NOT NULL,
    schema_version integer NOT NULL,
    version bigint NOT NULL,
    state jsonb NOT NULL,
    taken_at timestamptz NOT NULL DEFAULT now())"""
COMPONENT: Final = migrations.register(
    "aggregate_snapshots", Migration(1, "aggregate snapshots", _DDL))
_UPSERT: Final = (
    "INSERT INTO lakefold.aggregate_snapshots (stream_id, aggregate, schema_version, version, "
    "state) VALUES (%s, %s, %s, %s, %s::jsonb) ON CONFLICT (stream_id) DO UPDATE SET "
    "aggregate = excluded.aggregate, schema_version = excluded.schema_version, "
    "version = excluded.version, state = excluded.state, taken_at = now() "
    "WHERE aggregate_snapshots.version < excluded.version")


class PostgresSnapshots:
    """Snapshots in ``lakefold.aggregate_snapshots``, beside the PostgreSQL event store."""

    def __init__(self, recorder: PostgresRecorder) -> None:
        self.recorder = recorder
        self._installed = False

    def _install(self, conn: psycopg.Connection[Any]) -> None:
        if not self._installed:
            migrations.migrate(conn, COMPONENT)
            self._installed = True

    def load(self, stream_id: str) -> Snapshot | None:
        with self.recorder.connection() as conn:
            self._install(conn)
            row = conn.execute(
                "SELECT aggregate, schema_version, version, state::text FROM "
                "lakefold.aggregate_snapshots WHERE stream_id = %s", (stream_id,)).fetchone()
        return None if row is None else Snapshot(stream_id, str(row[0]), int(row[1]),
                                                 int(row[2]), str(row[3]))

    def save(self, snapshot: Snapshot, unit: UnitOfWork | None = None) -> None:
        values = (snapshot.stream_id, snapshot.aggregate, snapshot.schema_version,
                  snapshot.version, snapshot.state)
        if unit is not None:
            self._install(unit.connection)
            unit.connection.execute(_UPSERT, values)
            return
        with self.recorder.connection() as conn:
            self._install(conn)
            conn.execute(_UPSERT, values)


def _class_name(cls: type[Any]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class Repository(Generic[A]):
    """Loads and saves aggregates of one class (see the module docstring)."""

    def __init__(self, store: EventStore, aggregate: type[A], *,
                 snapshot_every: int | None = None,
                 snapshots: SnapshotStore | None = None) -> None:
        if not (isinstance(aggregate, type) and issubclass(aggregate, Aggregate)):
            raise AggregateError(f"Repository takes an Aggregate subclass, not {aggregate!r}")
        if store.registry is None:
            raise AggregateError(
                "the repository's store needs the event registry (EventStore(dsn, "
                "registry=...)): aggregates raise registered models, and loading decodes them")
        if snapshot_every is not None and (not isinstance(snapshot_every, int)
                                           or snapshot_every < 1):
            raise AggregateError(f"snapshot_every must be a positive number of events, not "
                                 f"{snapshot_every!r}")
        self.store = store
        self.aggregate = aggregate
        self.snapshot_every = snapshot_every
        if snapshots is None and snapshot_every is not None:
            recorder = store.recorder
            if isinstance(recorder, PostgresRecorder):
                snapshots = PostgresSnapshots(recorder)
            elif isinstance(recorder, InMemoryRecorder):
                snapshots = InMemorySnapshots()
            else:
                raise AggregateError("snapshots need snapshots=... for this event recorder")
        self.snapshots = snapshots

    # ------------------------------------------------------------------ load

    def get(self, id: str) -> A:
        """The aggregate with this id, from its latest usable snapshot and the events after."""
        aggregate = self.aggregate(id)
        self._restore(aggregate)
        for envelope in self.store.read_stream(aggregate.stream_id,
                                               from_version=aggregate.version + 1):
            if envelope.type == STREAM_DELETED_TYPE:
                raise AggregateNotFoundError(
                    f"{type(aggregate).__name__} {id!r} was deleted (stream "
                    f"{aggregate.stream_id!r})")
            if envelope.event is None:
                raise AggregateError(
                    f"event {envelope.type!r} (version {envelope.schema_version}) at "
                    f"{aggregate.stream_id} version {envelope.stream_version} is not in the "
                    "store's registry; register its model (and upcasters) to load this "
                    "aggregate")
            aggregate._apply(envelope.event)
            aggregate.version = envelope.stream_version
        if aggregate.version == 0:
            raise AggregateNotFoundError(
                f"no {type(aggregate).__name__} {id!r}: stream {aggregate.stream_id!r} has no "
                "events")
        return aggregate

    def _restore(self, aggregate: A) -> None:
        if self.snapshots is None:
            return
        try:
            snapshot = self.snapshots.load(aggregate.stream_id)
        except EventStoreError as e:
            log.warning("could not read the snapshot of %s (%s); loading from events",
                        aggregate.stream_id, e)
            return
        if snapshot is None:
            return
        cls = type(aggregate)
        if snapshot.aggregate != _class_name(cls) or \
                snapshot.schema_version != cls.snapshot_version:
            log.info("passing over the snapshot of %s (%s, snapshot version %d; now %s, %d): "
                     "loading from events", aggregate.stream_id, snapshot.aggregate,
                     snapshot.schema_version, _class_name(cls), cls.snapshot_version)
            return
        try:
            state = json.loads(snapshot.state)
            if not isinstance(state, dict):
                raise AggregateError(
                    f"a snapshot state is a JSON object, not {type(state).__name__}")
            aggregate.restore_state(state)
        except Exception as e:
            log.warning("the snapshot of %s at version %d does not restore (%s: %s); loading "
                        "from events", aggregate.stream_id, snapshot.version,
                        type(e).__name__, e)
            fresh = self.aggregate(aggregate.id)
            vars(aggregate).clear()
            vars(aggregate).update(vars(fresh))
            return
        aggregate.version = snapshot.version

    # ------------------------------------------------------------------ save

    def save(self, *aggregates: A, unit: UnitOfWork | None = None) -> AppendResult | None:
        """Append every aggregate's pending events in one transaction (``unit``: the caller's),
        each expecting the version it was loaded at; then snapshot those past an interval.
        None when nothing was pending."""
        todo = [a for a in aggregates if a.pending]
        if not todo:
            return None
        streams = [StreamEvents(a.stream_id, list(a.pending),
                                expected_version=a.saved_version or NO_STREAM) for a in todo]
        if len({s.stream_id for s in streams}) != len(streams):
            raise AggregateError("save() got the same aggregate twice; save each once")
        result = unit.append_streams(streams) if unit is not None else \
            self.store.append_streams(streams)
        for aggregate in todo:
            before = aggregate.saved_version
            aggregate._saved()
            every = self.snapshot_every
            if every is not None and aggregate.version // every > before // every:
                self._snapshot(aggregate, unit)
        return result

    def _snapshot(self, aggregate: A, unit: UnitOfWork | None) -> None:
        assert self.snapshots is not None  # noqa: S101 - set with snapshot_every
        cls = type(aggregate)
        try:
            snapshot = Snapshot(aggregate.stream_id, _class_name(cls), cls.snapshot_version,
                                aggregate.version, json.dumps(aggregate.snapshot_state()))
            self.snapshots.save(snapshot, unit)
        except (EventStoreError, TypeError, ValueError) as e:
            if unit is not None:
                raise  # inside the caller's transaction: do not leave it half done
            log.warning("could not snapshot %s at version %d: %s", aggregate.stream_id,
                        aggregate.version, e)

    # ------------------------------------------------------------------ commands

    def retry(self, command: Callable[[], T], *, attempts: int = 20,
              backoff_s: float = 0.002) -> T:
        """Run ``command`` (which loads, acts and saves) until it does not meet a concurrent
        save, at most ``attempts`` times; the last conflict is raised."""
        if attempts < 1:
            raise AggregateError(f"attempts must be at least 1, not {attempts}")
        attempt = 1
        while True:
            try:
                return command()
            except WrongExpectedVersionError:
                if attempt >= attempts:
                    raise
                time.sleep(backoff_s * attempt * random.random())  # noqa: S311 - jitter
                attempt += 1

    def update(self, id: str, command: Callable[[A], Any], *,
               attempts: int = 20) -> A:
        """Load the aggregate, run ``command`` on it and save it, again on a conflict."""
        def once() -> A:
            aggregate = self.get(id)
            command(aggregate)
            self.save(aggregate)
            return aggregate

        return self.retry(once, attempts=attempts)
