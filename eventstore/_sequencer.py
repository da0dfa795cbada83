"""The global order: dense positions handed out after visibility, without a global lock.

Why not a bigserial? A sequence value is taken when a row is inserted, but the row becomes
visible when its transaction commits, and transactions commit in any order. Writer A takes 41,
writer B takes 42 and commits first; a reader that sees 42 and moves its cursor past it will
never see 41 when A commits a moment later. Marten (#3321, #4952) and Eventuous (#222) lost
events this way. The ``eventsourcing`` library avoids it with ``LOCK TABLE ... IN EXCLUSIVE
MODE`` in every insert, which makes all writers take turns: 16 writers go no faster than one.

What we do instead. Every event row records its writer's top-level transaction id
(``xid``, a 64-bit ``xid8`` from ``pg_current_xact_id()``, which never wraps) and its
``ordinal`` within that transaction (0, 1, 2... over all the transaction's appends). Writers
do nothing else: they take no lock but the row lock of the streams they append to.

The watermark ``W = pg_snapshot_xmin(pg_current_snapshot())`` is the oldest transaction id
still running. Every transaction with ``xid < W`` has finished, committed or rolled back, and a
snapshot taken at or after that moment sees all of its committed rows; no transaction that
commits later can have an ``xid < W``, because xids are handed out in increasing order and the
running ones are all ``>= W``. So the committed events with ``xid < W`` are *final*: that set
will never grow again. Sequencing (``lakefold.sequence_events()``) then:

1. takes the sequencers' mutex, a transaction-level advisory lock keyed on the oid of
   ``lakefold.event_sequencer`` (only sequencers take it, so writers never wait for it; it
   gives the transaction no xid);
2. reads ``W`` from a snapshot taken after the lock and before its own transaction has an
   xid (so no other sequencer is running and holding ``W`` back), and the cursor: the last
   position handed out and the last transaction that got positions;
3. gives each final transaction after the cursor (``cursor < xid < W``), in xid order, the
   next run of positions, one per ordinal: a row ``(first_position, xid, events)`` in
   ``lakefold.event_positions``, so an event's position is ``first_position + ordinal``;
   moves the cursor; NOTIFYs subscribers. One row per transaction, not per event: a batch of
   1,000 events costs one row.

Why it is gap-free and monotone. Each round takes transactions above the cursor and below
``W``; any event that appears later belongs to a transaction with ``xid >= W`` (still running
when ``W`` was read), so it sorts after everything sequenced in this round. Hence positions
follow ``(xid, ordinal)`` order, a reader that has read up to position ``p`` can never find a
new event below ``p``, and every committed event gets exactly one position, handed out once
(the primary key on ``first_position`` and the unique key on ``xid`` enforce it; runs are
contiguous, so positions are dense). Rolled-back events are never visible, so they never get
a position; an event erased by a hard delete leaves a hole. Readers stop at the cursor, so
they never see an unsequenced event.

The price. A long-running transaction that has an xid (in *any* database of the cluster: xids
are cluster-wide) holds ``W`` back: events committed after it started stay invisible to global
readers until it ends. They are delayed, never skipped. ``EventStore.status()`` reports the
pending events and names the holding transaction (pg_stat_activity: pid, xact_start, query)
once it has held the watermark longer than ``StoreOptions.watermark_threshold_s``; keep
transactions short. Streams read their own events immediately (``read_stream`` does not need
positions; it shows ``position=None`` until then), and the global position of a fresh event is
known once it is sequenced (``EventStore.wait_for_positions``).

Who sequences. Any reader that asks for the head (``head()``, ``read_all``, subscriptions)
runs a round; so does a background thread of each ``EventStore`` shortly after its appends,
so positions appear within milliseconds. A round that finds nothing to do gets no xid and
writes nothing. Because every round computes ``W`` while it holds the mutex, ``head()``
always covers every event committed before it was called (unless an older transaction still
holds the watermark). Sequencing must run in its own READ COMMITTED transaction (the function
refuses otherwise): inside a longer transaction it would read a stale cursor and hold the
mutex for too long.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from lakefold.eventstore._background import WakeableThread
from lakefold.eventstore._model import EventStoreStatus, Sequenced, WatermarkHolder
from lakefold.eventstore.exceptions import EventStoreTerminalError

logger = logging.getLogger(__name__)

#: The most transactions one sequencing round gives positions to (bounds the round).
ROUND_LIMIT: Final = 50_000

_SEQUENCE = "SELECT o_head, o_pending, o_transactions FROM lakefold.sequence_events(%s)"

_PENDING = """
SELECT q.last_position, q.sequenced_at, count(e.xid), min(e.recorded_at)
FROM lakefold.event_sequencer q
LEFT JOIN lakefold.events e ON e.xid > q.last_xid
GROUP BY q.last_position, q.sequenced_at
"""

# The oldest running transaction with an xid, cluster-wide, and the oldest prepared one.
_HOLDER = """
SELECT a.pid, a.datname, a.usename, a.application_name, a.state, a.xact_start,
       extract(epoch FROM now() - a.xact_start)::float8, a.query, NULL::text
FROM pg_stat_activity a
WHERE a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()
UNION ALL
SELECT NULL, x.database, x.owner::text, NULL, 'prepared', x.prepared,
       extract(epoch FROM now() - x.prepared)::float8, NULL, x.gid
FROM pg_prepared_xacts x
ORDER BY 7 DESC NULLS LAST
LIMIT 1
"""


def one_row(row: TupleRow | None) -> TupleRow:
    """The row a statement that always returns one row returned."""
    if row is None:
        raise EventStoreTerminalError("the event store returned no row where one was expected; "
                              "check that `lakefold events install` ran on this database")
    return row


def sequence_once(conn: psycopg.Connection[TupleRow], limit: int = ROUND_LIMIT) -> Sequenced:
    """Run one sequencing round on ``conn`` (autocommit). Raises psycopg errors unchanged."""
    head, pending, assigned = one_row(conn.execute(_SEQUENCE, (limit,), prepare=True).fetchone())
    # A full round may leave more final events behind: go again until a round is short.
    while assigned >= limit:
        head, pending, assigned = one_row(
            conn.execute(_SEQUENCE, (limit,), prepare=True).fetchone())
    return Sequenced(head=int(head), pending=bool(pending))


_SEALED = ("SELECT count(*), coalesce(sum(end_position - first_position), 0) "
           "FROM lakefold.event_segments")


def read_status(conn: psycopg.Connection[TupleRow], threshold_s: float) -> EventStoreStatus:
    """Head, pending events, sealing and the watermark holder, after a sequencing round."""
    sequence_once(conn)
    head, sequenced_at, pending, oldest = one_row(conn.execute(_PENDING).fetchone())
    segments, sealed = one_row(conn.execute(_SEALED).fetchone())
    holder_row = conn.execute(_HOLDER).fetchone()
    holder = None
    if holder_row is not None:
        pid, db, user, app, state, start, held_for, query, gid = holder_row
        holder = WatermarkHolder(pid=pid, database=db, user=user, application=app,
                                 state=state, xact_start=start, held_for_s=float(held_for or 0),
                                 query=query, prepared_gid=gid)
    held = bool(pending) and holder is not None and holder.held_for_s >= threshold_s
    return EventStoreStatus(head=int(head), pending_events=int(pending), oldest_pending_at=oldest,
                            sequenced_at=sequenced_at, holder=holder, threshold_s=threshold_s,
                            held=held, segments=int(segments),
                            unsealed_positions=int(head) - int(sealed))


class BackgroundSequencer(WakeableThread):
    """A daemon thread that runs sequencing rounds soon after appends (``poke``), so positions
    appear and subscribers are woken within milliseconds without making writers wait.

    Rounds are at least ``interval_s`` apart, so a burst of appends costs one round; each
    successful round reports the head to ``on_head`` (which must not block). While
    events are pending behind the watermark it retries with backoff up to ``max_backoff_s``,
    and when a pending event is older than ``threshold_s`` it logs a warning naming the
    transaction that holds the watermark (at most once per ``threshold_s``).
    """

    def __init__(self, connect: Callable[[], psycopg.Connection[TupleRow]], *,
                 interval_s: float, threshold_s: float, max_backoff_s: float = 1.0,
                 on_head: Callable[[int], None] | None = None) -> None:
        super().__init__("lakefold-sequencer", join_timeout_s=30)
        self._connect = connect
        self._on_head = on_head
        self._interval = interval_s
        self._threshold = threshold_s
        self._max_backoff = max_backoff_s
        self._pending_since: datetime | None = None
        self._warned_at: datetime | None = None

    def _run(self) -> None:
        conn: psycopg.Connection[TupleRow] | None = None
        backoff = self._interval
        pending = False
        try:
            while not self._stop.is_set():
                self._wake.wait(timeout=backoff if pending else None)
                if self._stop.is_set():
                    break
                self._wake.clear()
                try:
                    if conn is None or conn.closed:
                        conn = self._connect()
                    result = sequence_once(conn)
                except psycopg.Error as e:
                    logger.warning("event sequencer round failed (%s: %s); retrying in %.1f s",
                                   type(e).__name__, e, self._max_backoff)
                    if conn is not None:
                        conn.close()
                        conn = None
                    pending, backoff = True, self._max_backoff
                    self._stop.wait(self._max_backoff)
                    continue
                if self._on_head is not None:
                    self._on_head(result.head)
                pending = result.pending
                backoff = min(backoff * 2, self._max_backoff) if pending else self._interval
                if pending:
                    self._warn_if_held(conn)
                else:
                    self._pending_since = None
                self._stop.wait(self._interval)  # coalesce a burst of pokes into one round
        finally:
            if conn is not None:
                conn.close()

    def _warn_if_held(self, conn: psycopg.Connection[TupleRow]) -> None:
        now = datetime.now(UTC)
        if self._pending_since is None:
            self._pending_since = now
            return
        if (now - self._pending_since).total_seconds() < self._threshold:
            return
        if self._warned_at is not None and (
            now - self._warned_at
        ).total_seconds() < self._threshold:
            return
        self._warned_at = now
        try:
            status = read_status(conn, self._threshold)
        except psycopg.Error as e:
            logger.warning("cannot read the event store status: %s", e)
            return
        if status.held and status.holder is not None:
            logger.warning(
                "%d events are waiting for the visibility watermark, held by %s; they become "
                "visible when that transaction ends", status.pending_events,
                status.holder.describe(),
            )
