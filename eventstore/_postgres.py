"""The PostgreSQL recorder: appends through ``lakefold.append_events`` (one round trip, no global
lock), one plain statement for a single stream outside a transaction (``_fastpath.py``) or, for
large appends, text-format COPY (``_copy.py``); reads in ``_reads.py`` (only sequenced
events; see ``_sequencer.py`` for why that makes the global order gap-free); a pool of
autocommit connections shared by threads; a background sequencer.

Idempotency: an append whose version check fails, or whose event id collides, looks the event
ids up. If they are all stored with the same stream, type, schema version, data and metadata,
the original result is returned (``duplicate=True``) and nothing is written; a partial or
different match is an ``IdempotencyConflictError`` naming what differs. The fast path pays nothing
for this.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

import psycopg
import psycopg.types.json
import psycopg_pool
from psycopg import sql
from psycopg.rows import TupleRow

from lakefold.core.dsn import mask_dsn
from lakefold.eventstore import _ddl
from lakefold.eventstore._copy import COPY_THRESHOLD, copy_append, expected_code
from lakefold.eventstore._fastpath import fast_append
from lakefold.eventstore._model import (
    AppendedEvent,
    AppendResult,
    EventStoreStatus,
    ExpectedVersion,
    LogQuery,
    Sealed,
    Sequenced,
    StreamAppend,
    StreamQuery,
    StreamState,
    describe_expected,
)
from lakefold.eventstore._reads import read_log_on, read_stream_on
from lakefold.eventstore._recorder import EventRecorder, Waiter
from lakefold.eventstore._sealer import BackgroundSealer, seal
from lakefold.eventstore._segments import SEGMENT_POSITIONS
from lakefold.eventstore._sequencer import (
    BackgroundSequencer,
    one_row,
    read_status,
    sequence_once,
)
from lakefold.eventstore._translate import one_line, raise_translated
from lakefold.eventstore.exceptions import (
    EventStoreTerminalError,
    EventStoreUnavailableError,
    IdempotencyConflictError,
    StreamDeletedError,
    WrongExpectedVersionError,
)
from lakefold.schemas.events import (
    EventEnvelope,
)

Conn = psycopg.Connection[TupleRow]

# %b: binary parameters, so arrays of JSON texts need no quoting or escaping.
_APPEND: Final = (
    "SELECT lakefold.append_events(%b::text[], %b::text[], %b::bigint[], %b::integer[], "
    "%b::uuid[], %b::integer[], %b::text[], %b::integer[], %b::text[], %b::text[], "
    "%b::uuid[], %b::uuid[])"
)
# Per stored event id of an append: the stored event, the retry's stream, and whether its data
# and its metadata (free-form JSON, correlation and causation ids) equal the retry's.
_DUPLICATES: Final = """
SELECT e.event_id, e.stream_id, e.stream_version, p.first_position + e.ordinal,
       e.type, e.schema_version, s.stream_ids[c.k], c.t, c.v,
       e.data::jsonb = c.d::jsonb,
       (e.metadata = COALESCE(c.m::jsonb, '{}'::jsonb)
        AND e.correlation_id IS NOT DISTINCT FROM c.cr
        AND e.causation_id IS NOT DISTINCT FROM c.ca)
FROM (SELECT %b::text[] AS stream_ids) AS s,
     unnest(%b::uuid[], %b::integer[], %b::text[], %b::integer[], %b::text[], %b::text[],
            %b::uuid[], %b::uuid[]) WITH ORDINALITY AS c(i, k, t, v, d, m, cr, ca, o)
JOIN lakefold.events e ON e.event_id = c.i
LEFT JOIN lakefold.event_positions p ON p.xid = e.xid
ORDER BY c.o
"""

_DECODER: Final = json.JSONDecoder()


def _loads(data: str | bytes) -> Any:
    """jsonb as the server sends it: well-formed UTF-8 with no surrounding whitespace, so the
    decoder's scan needs none of ``json.loads``' checks (about half its cost per event)."""
    return _DECODER.raw_decode(data.decode() if isinstance(data, bytes) else data)[0]


def configure_connection(conn: psycopg.Connection[Any]) -> None:
    """Per-connection setup for the store's connections: the fast jsonb decoder, the session
    time zone UTC (``recorded_at`` comes back in UTC whatever the server's zone, and psycopg
    builds UTC datetimes about twice as fast as zoned ones)."""
    psycopg.types.json.set_json_loads(_loads, conn)
    conn.execute("SET TIME ZONE 'UTC'")


def append_params(appends: Sequence[StreamAppend]) -> tuple[Any, ...]:
    """The arguments of ``lakefold.append_events`` for validated appends: the stream arrays,
    then one array per event field, in append order."""
    stream_ids, categories, expected, counts = [], [], [], []
    ids, index, types, versions, data, metadata, correlation, causation = (
        [], [], [], [], [], [], [], [])
    for k, append in enumerate(appends, start=1):
        stream_ids.append(append.stream_id)
        categories.append(append.category)
        expected.append(expected_code(append.expected_version))
        counts.append(len(append.events))
        for encoded in append.events:
            event = encoded.event
            meta = event.metadata
            ids.append(event.event_id)
            index.append(k)
            types.append(event.type)
            versions.append(event.schema_version)
            data.append(encoded.data_json)
            metadata.append(None if encoded.metadata_json == "{}" else encoded.metadata_json)
            correlation.append(meta.correlation_id)
            causation.append(meta.causation_id)
    return (stream_ids, categories, expected, counts, ids, index, types, versions, data,
            metadata, correlation, causation)


class _ListenWaiter(Waiter):
    """LISTEN on the sequencer's channel on a dedicated connection."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(_ddl.NOTIFY_CHANNEL)))

    def wait(self, timeout: float) -> bool:
        try:
            for _ in self._conn.notifies(timeout=timeout, stop_after=1):
                return True
        except psycopg.OperationalError as e:
            raise EventStoreUnavailableError(
                f"lost the LISTEN connection: {one_line(e)}; retry") from e
        return False

    def close(self) -> None:
        self._conn.close()


class _LastUsedFirstPool(psycopg_pool.ConnectionPool[Conn]):
    """A pool that hands out the connection returned last (psycopg_pool takes the one
    returned first).

    The pool grows whenever a caller empties it, so even one writer ends up with
    ``pool_size`` connections; taken in turn, every append then lands on a server process
    idle since ``pool_size`` appends ago, with cold caches and a process to wake (measured:
    one writer's p50 0.54 ms with 4 connections, 0.68 ms with 20, and a longer tail).
    Taking the last returned keeps the connections a workload needs warm; the others idle
    and the pool closes them after ``max_idle``."""

    def _get_ready_connection(self, timeout: float | None) -> Conn | None:
        # Called under the pool's lock. Idle connections queue oldest-returned first; move
        # the newest to the front, where the pool takes from. (The queue stays oldest-first,
        # so the pool's shrinking still closes the coldest.)
        if self._pool:
            self._pool.rotate(1)
        return super()._get_ready_connection(timeout)


class PostgresRecorder(EventRecorder):
    """The event store in schema ``lakefold`` of a PostgreSQL database.

    ``pool_size`` connections are shared by threads; a background thread sequences events
    shortly after appends (see ``_sequencer.BackgroundSequencer``)."""

    # Large appends are COPYed, and copy_append encodes each event just before it sends it.
    streams_appends_from = COPY_THRESHOLD

    def __init__(self, dsn: str, *, pool_size: int = 10, connect_timeout_s: float = 10.0,
                 sequence_interval_s: float = 0.005, watermark_threshold_s: float = 5.0,
                 application_name: str = "lakefold-eventstore",
                 segment_positions: int = SEGMENT_POSITIONS,
                 seal_in_background: bool = True) -> None:
        self.dsn = dsn
        self._segment_positions = segment_positions
        self._masked = mask_dsn(dsn)
        try:
            params = psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as e:
            raise EventStoreTerminalError(f"the event store DSN is invalid: {e}; check it") from e
        # UTF-8 whatever the DSN asks: the one-event fast path sends its arguments as UTF-8.
        self._connect_kwargs: dict[str, Any] = {"autocommit": True, "client_encoding": "UTF8"}
        if "application_name" not in params:
            self._connect_kwargs["application_name"] = application_name
        if "connect_timeout" not in params:
            self._connect_kwargs["connect_timeout"] = max(1, round(connect_timeout_s))
        # Probe first: a refused or misconfigured connection fails now, with the server's
        # own reason, instead of after the pool's retries.
        self.connect().close()
        self._pool = _LastUsedFirstPool(
            dsn, min_size=1, max_size=pool_size, kwargs=self._connect_kwargs, open=False,
            timeout=connect_timeout_s, name="lakefold-eventstore",
            configure=configure_connection,
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except psycopg_pool.PoolTimeout as e:
            self._pool.close()
            raise EventStoreUnavailableError(
                f"cannot connect to the event store at {self._masked} within "
                f"{connect_timeout_s:.0f} s; check that the server is up and the DSN is right"
            ) from e
        # Without background sealing, ``seal()`` still seals on request.
        self._sealer = BackgroundSealer(dsn, size=segment_positions) if seal_in_background \
            else None
        self._sequencer = BackgroundSequencer(
            self.connect, interval_s=sequence_interval_s, threshold_s=watermark_threshold_s,
            on_head=None if self._sealer is None else self._sealer.notice)

    # -- connections --------------------------------------------------------------------------

    def connect(self) -> Conn:
        """A new autocommit connection (not from the pool); the caller closes it."""
        try:
            conn = psycopg.connect(self.dsn, **self._connect_kwargs)
        except psycopg.OperationalError as e:
            raise EventStoreUnavailableError(
                f"cannot connect to the event store at {self._masked}: {one_line(e)}; check "
                "that the server is up and the DSN is right"
            ) from e
        configure_connection(conn)
        return conn

    def connection(self) -> PooledConnection:
        """A pooled autocommit connection for a ``with`` block, with driver errors translated."""
        return PooledConnection(self._pool, self._masked)

    def poke(self) -> None:
        """Ask the background sequencer for a round (after a commit that appended)."""
        self._sequencer.poke()

    def close(self) -> None:
        self._sequencer.close()
        if self._sealer is not None:
            self._sealer.close()
        self._pool.close()

    def seal(self, *, progress: Callable[[int, int], None] | None = None) -> Sealed:
        return seal(self.dsn, size=self._segment_positions, progress=progress)

    def install(self) -> None:
        _ddl.install(self.dsn)

    # -- append -------------------------------------------------------------------------------

    def append(self, appends: Sequence[StreamAppend]) -> AppendResult:
        with self.connection() as conn:
            result = append_on(conn, appends)
        if not result.duplicate:
            self._sequencer.poke()
        return result

    # -- reads --------------------------------------------------------------------------------

    def read_stream(self, stream_id: str, query: StreamQuery) -> list[EventEnvelope]:
        with self.connection() as conn:
            return read_stream_on(conn, stream_id, query)

    def read_log(self, query: LogQuery) -> list[EventEnvelope]:
        with self.connection() as conn:
            return read_log_on(conn, query)

    def sequence(self) -> Sequenced:
        with self.connection() as conn:
            return sequence_once(conn)

    def stream_state(self, stream_id: str) -> StreamState:
        with self.connection() as conn:
            row = conn.execute(
                "SELECT version, deleted FROM lakefold.streams WHERE stream_id = %s",
                (stream_id,),
            ).fetchone()
        if row is None:
            return StreamState(stream_id, 0)
        return StreamState(stream_id, int(row[0]), row[1])

    def positions_of(self, event_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int | None]:
        with self.connection() as conn:
            rows = conn.execute(
                "SELECT e.event_id, p.first_position + e.ordinal FROM lakefold.events e "
                "LEFT JOIN lakefold.event_positions p ON p.xid = e.xid "
                "WHERE e.event_id = ANY(%s)",
                (list(event_ids),),
            ).fetchall()
        return {row[0]: row[1] for row in rows}

    # -- deletion -----------------------------------------------------------------------------

    def delete_stream(self, stream_id: str, *, expected_version: ExpectedVersion, hard: bool,
                      event_id: uuid.UUID) -> AppendedEvent:
        with self.connection() as conn:
            try:
                row = conn.execute(
                    "SELECT lakefold.delete_stream(%s, %s::bigint, %s, %s)",
                    (stream_id, expected_code(expected_version), hard, event_id),
                ).fetchone()
            except psycopg.Error as e:
                error = _append_error(e, {stream_id: expected_version})
                if error is e:
                    raise
                raise error from e
        self._sequencer.poke()
        if self._sealer is not None:
            self._sealer.poke()  # seal the ranges the deletion unsealed again
        return AppendedEvent(event_id, stream_id, int(one_row(row)[0]))

    # -- checkpoints, waiting, status ---------------------------------------------------------

    def load_checkpoint(self, name: str) -> int | None:
        with self.connection() as conn:
            row = conn.execute(
                "SELECT position FROM lakefold.subscription_checkpoints WHERE name = %s", (name,)
            ).fetchone()
        return None if row is None else int(row[0])

    def save_checkpoint(self, name: str, position: int) -> None:
        with self.connection() as conn:
            save_checkpoint(conn, name, position)

    def open_waiter(self) -> Waiter:
        conn = self.connect()
        try:
            return _ListenWaiter(conn)
        except psycopg.Error as e:
            conn.close()
            raise EventStoreUnavailableError(
                f"cannot LISTEN at {self._masked}: {one_line(e)}") from e

    def status(self, threshold_s: float) -> EventStoreStatus:
        with self.connection() as conn:
            return read_status(conn, threshold_s)


class PooledConnection:
    """A connection of ``pool`` for one ``with`` block, driver errors translated on the way out.

    A class rather than ``translate_errors`` around a generator: every append takes one, and
    two generator-based context managers cost more than a one-event append's own Python work.
    ``getconn`` and ``putconn`` rather than the pool's ``connection()``, which also times the
    use and commits on the way out (one more wait under the interpreter lock)."""

    __slots__ = ("_conn", "_masked", "_pool")

    def __init__(self, pool: psycopg_pool.ConnectionPool[Conn], masked_dsn: str) -> None:
        self._pool = pool
        self._masked = masked_dsn

    def __enter__(self) -> Conn:
        try:
            self._conn = self._pool.getconn()
        except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
            raise_translated(e, self._masked)
            raise
        return self._conn

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        self._pool.putconn(self._conn)
        if isinstance(error, psycopg.Error | psycopg_pool.PoolTimeout):
            raise_translated(error, self._masked)


def save_checkpoint(conn: psycopg.Connection[Any], name: str, position: int) -> None:
    """Save subscription ``name``'s checkpoint on ``conn``: inside the caller's transaction when
    one is open, so the checkpoint commits (or rolls back) with the caller's own writes."""
    if not isinstance(name, str) or not name:
        raise EventStoreTerminalError(
            f"checkpoint name {name!r} is invalid: use a non-empty string")
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise EventStoreTerminalError(
            f"checkpoint position {position!r} is invalid: use an int >= 0")
    conn.execute(
        "INSERT INTO lakefold.subscription_checkpoints (name, position) VALUES (%s, %s) "
        "ON CONFLICT (name) DO UPDATE SET position = excluded.position, updated_at = now()",
        (name, position),
    )


def _append_error(error: psycopg.Error, expected: dict[str, ExpectedVersion]) -> Exception:
    """The lakefold error for a failed append or delete (``error`` itself when it is not one
    of ours)."""
    state = error.sqlstate
    if state in (_ddl.SQLSTATE_WRONG_EXPECTED_VERSION, _ddl.SQLSTATE_STREAM_DELETED):
        detail = json.loads(error.diag.message_detail or "{}")
        stream_id = detail["stream_id"]
        if state == _ddl.SQLSTATE_STREAM_DELETED:
            return StreamDeletedError(stream_id, mode=detail["deleted"])
        return WrongExpectedVersionError(stream_id, expected=describe_expected(expected[stream_id]),
                                    actual_version=detail["actual"])
    return error


def _is_conflict(error: psycopg.Error) -> bool:
    return error.sqlstate in (
        _ddl.SQLSTATE_WRONG_EXPECTED_VERSION, _ddl.SQLSTATE_STREAM_DELETED
    ) or (
        isinstance(error, psycopg.errors.UniqueViolation)
        and error.diag.constraint_name == "events_event_id_key"
    )


def append_on(conn: Conn, appends: Sequence[StreamAppend]) -> AppendResult:
    """Append on ``conn``: one ``append_events`` call, or COPY for large appends. In the
    caller's transaction the append runs under a savepoint, so a conflict leaves that
    transaction usable."""
    in_transaction = conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
    use_copy = sum(len(a.events) for a in appends) >= COPY_THRESHOLD
    if len(appends) == 1 and not use_copy and not in_transaction:
        try:
            prev = fast_append(conn, appends[0])
        except psycopg.errors.UniqueViolation:
            prev = None  # an event id collision: the full path tells a retry from a conflict
        if prev is not None:
            return AppendResult(tuple(
                AppendedEvent(e.event.event_id, appends[0].stream_id, prev + offset)
                for offset, e in enumerate(appends[0].events, start=1)))
    params = None if use_copy else append_params(appends)
    for attempt in range(3):
        try:
            if use_copy and not in_transaction:
                prev_versions = _copy_committed(conn, appends)
            elif use_copy:
                with conn.transaction():
                    prev_versions = copy_append(conn, appends, begin=False)
            elif in_transaction:
                with conn.transaction():
                    prev_versions = one_row(conn.execute(_APPEND, params,
                                                         prepare=True).fetchone())[0]
            else:
                prev_versions = one_row(conn.execute(_APPEND, params,
                                                     prepare=True).fetchone())[0]
            break
        except psycopg.Error as e:
            if not _is_conflict(e):
                raise
            duplicate = _find_duplicate(conn, appends, params or append_params(appends))
            if duplicate is not None:
                return duplicate
            conflict = _append_error(e, {a.stream_id: a.expected_version for a in appends})
            if conflict is not e:
                raise conflict from e
            if attempt == 2:  # an id collided with an event that is gone again: rare, transient
                raise EventStoreUnavailableError(
                    "an event id of this append collided with a concurrent append three times; "
                    "retry the append"
                ) from e
    events = []
    for append, prev in zip(appends, prev_versions, strict=True):
        for offset, encoded in enumerate(append.events, start=1):
            events.append(AppendedEvent(encoded.event.event_id, append.stream_id, prev + offset))
    return AppendResult(tuple(events))


def _copy_committed(conn: Conn, appends: Sequence[StreamAppend]) -> list[int]:
    """``copy_append`` in a transaction of its own on the idle autocommit ``conn``: begun with
    the reservation and committed with the runs (two round trips less than
    ``conn.transaction()``), rolled back on any error (a validation error from the COPY stream
    included)."""
    try:
        prev_versions = copy_append(conn, appends, begin=True)
    except BaseException:
        if not conn.closed:  # a lost connection has no transaction left to roll back
            conn.rollback()
        raise
    return prev_versions


def _find_duplicate(conn: Conn, appends: Sequence[StreamAppend], params: tuple[Any, ...]
                    ) -> AppendResult | None:
    rows = conn.execute(_DUPLICATES, (params[0], *params[4:12])).fetchall()
    if not rows:
        return None
    total = sum(len(a.events) for a in appends)
    if len(rows) < total:
        raise IdempotencyConflictError(
            f"{len(rows)} of the {total} event ids of this append are already stored; a retry "
            "must resend exactly the original events (nothing was written)"
        )
    for row in rows:
        (event_id, stream_id, version, _, type_, schema_version,
         new_stream, new_type, new_version, same_data, same_metadata) = row
        if (stream_id, type_, schema_version) != (new_stream, new_type, new_version) \
                or not (same_data and same_metadata):
            raise IdempotencyConflictError.differing(
                event_id, stored=(stream_id, int(version), type_, schema_version),
                retried=(new_stream, new_type, new_version), data=not same_data,
                metadata=not same_metadata)
    return AppendResult(
        tuple(AppendedEvent(row[0], row[1], int(row[2]), row[3]) for row in rows),
        duplicate=True,
    )
