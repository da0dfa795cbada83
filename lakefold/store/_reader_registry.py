"""Durable readers of changelog streams and what they hold back (Kafka's consumer groups next
to its log cleaner).

A durable reader (a projection generation, a subscription) records per stream the last
position it has processed, once the effect of processing it is committed (``commit``).
Compaction (``_compaction``) never removes a record after the lowest such position of a stream
and never expires a tombstone there, so a reader that is slow, stopped or paused for days still
finds every update and delete it has not processed. A reader holds compaction for as long as it
is registered: ``release`` it when it is gone for good. ``state`` says what holds a stream's
compaction (the reader with the lowest position, and since when it has not moved).

What compaction removes, and who misses it:

- superseded records (an older record of a key that has a later one) and everything before a
  truncate record. A reader that keeps the latest state per key (an upsert table, a cache, an
  index) loses nothing when it does not see them: the later record is still there. A reader
  that keeps history (every version: SCD2, an append log) does. ``removed_to`` is the highest
  position of any record compaction removed.
- tombstones (deletes) and truncate records older than the retention. A reader that read the
  key's earlier records misses the delete. ``expired_to`` is the highest position of one. A
  reader that starts from the beginning (position 0) does not need them: the records they
  superseded are gone too.

So a reader that continues after position ``p`` would miss records when ``removed_to > p`` (a
history reader) or ``p > 0 and expired_to > p`` (a latest-state reader). ``commit`` checks that
in the transaction that registers the position and raises ``ReaderBehindCompactionError``
instead of letting the reader read on. That catches a reader created after compaction ran (a
new history view over a compacted stream) and one whose registration was lost. A reader that
moves forward from its own registration is not checked again: it held compaction all along,
so whatever was removed since was behind it (and what was removed before was checked when it
registered).

Concurrency: ``commit`` takes a share lock on the stream's ``changelog_compaction`` row; every
compaction chunk first locks that row for update, then reads the lowest reader position
(``lock_for_compaction``). Either the chunk sees the reader's position, or the reader's check
sees what the chunk removed.

A stream that keeps its full history (``set_keep_history``) is not compacted at all, so a
history reader can always start again from position 0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from lakefold.store.exceptions import CaptureValueError, ReaderBehindCompactionError


@dataclass(frozen=True, slots=True)
class ReaderPosition:
    """A durable reader of one stream: it has processed every record up to ``position``;
    ``moved_at`` is when that position last changed."""

    reader: str
    stream: str
    position: int
    history: bool
    registered_at: datetime
    moved_at: datetime


@dataclass(frozen=True, slots=True)
class CompactionState:
    """How far a stream is compacted and what holds it: ``compacted_to`` (positions up to it
    are compacted), ``removed_to`` / ``expired_to`` (highest position of a removed record / of
    an expired tombstone or truncate), ``removed`` (records removed in all), ``last_run``,
    whether the stream keeps its full history, and its durable readers, lowest first."""

    stream: str
    compacted_to: int
    removed: int
    removed_to: int
    expired_to: int
    last_run: datetime | None
    keep_history: bool
    keep_history_reason: str | None
    readers: tuple[ReaderPosition, ...]

    @property
    def held_by(self) -> ReaderPosition | None:
        """The reader compaction cannot pass: the one with the lowest position."""
        return self.readers[0] if self.readers else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (datetimes in ISO form), with ``held_by``."""
        out = asdict(self)
        out["readers"] = [_iso(asdict(r)) for r in self.readers]
        out["held_by"] = out["readers"][0] if self.readers else None
        return _iso(out)


def _iso(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in values.items()}


def _when(moment: datetime | None) -> str:
    return "never" if moment is None else moment.astimezone(UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC")


def installed(conn: psycopg.Connection[Any]) -> bool:
    """True when the store has the readers table and the compaction columns (a store
    installed by an older lakefold has neither until ``_ddl.install`` runs again)."""
    row = conn.execute(
        "SELECT to_regclass('lakefold.changelog_readers') IS NOT NULL AND EXISTS (SELECT 1 "
        "FROM information_schema.columns WHERE table_schema = 'lakefold' "
        "AND table_name = 'changelog_compaction' AND column_name = 'keep_history')").fetchone()
    return bool(row and row[0])


def _ensure_row(conn: psycopg.Connection[Any], stream_id: int) -> None:
    conn.execute("INSERT INTO lakefold.changelog_compaction (stream_id) VALUES (%s) "
                 "ON CONFLICT DO NOTHING", (stream_id,))


def _behind(reader: str, stream: str, position: int, history: bool, removed: int,
            removed_to: int, expired_to: int, last_run: datetime | None
            ) -> ReaderBehindCompactionError | None:
    """The error for a reader continuing after ``position``, or None when it misses nothing."""
    if history and removed_to > position:
        return ReaderBehindCompactionError(
            f"reader {reader} would read {stream} after position {position}, but compaction "
            f"of that stream removed records up to position {removed_to} (superseded versions "
            f"and records before truncates; {removed:,} removed in all, last compaction run "
            f"{_when(last_run)}): a reader that keeps every version would miss some. Removed "
            "records cannot be read again; a stream keeps them only while it keeps its full "
            "history (`lakefold capture keep-history STREAM`)",
            reader=reader, stream=stream, position=position, removed_to=removed_to,
            last_run=last_run, history=True)
    if not history and position > 0 and expired_to > position:
        return ReaderBehindCompactionError(
            f"reader {reader} would read {stream} after position {position}, but compaction "
            f"of that stream removed deletes (tombstones past their retention) up to position "
            f"{expired_to} (last compaction run {_when(last_run)}): the reader would miss those "
            "deletes. Read the stream again from the start (a rebuild): the compacted stream "
            "still holds the latest record of every key",
            reader=reader, stream=stream, position=position, removed_to=expired_to,
            last_run=last_run, history=False)
    return None


def commit(conn: psycopg.Connection[Any], reader: str, stream_id: int, stream: str,
           position: int, *, history: bool) -> None:
    """Register (or move) ``reader``'s position in a stream: it has processed every record up
    to ``position`` (0: none yet), so compaction keeps every record after it. Raises
    ReaderBehindCompactionError, registering nothing, when compaction already removed records
    after ``position`` that the reader needs (see the module docstring); a reader moving on
    from its own registration is not checked again (it held compaction all along). ``conn``
    is autocommit; the check and the registration are one transaction."""
    if not reader:
        raise CaptureValueError("a durable reader needs a non-empty name")
    if position < 0:
        raise CaptureValueError(f"a reader's position is 0 or more, not {position}")
    with conn.transaction():
        # The reader's own row is only written by the reader: the snapshot it is read in
        # does not matter; the compaction row is read as locked (its latest version).
        query = ("SELECT c.removed, c.removed_to, c.expired_to, c.last_run, r.position, "
                 "r.history FROM lakefold.changelog_compaction c LEFT JOIN "
                 "lakefold.changelog_readers r ON r.stream_id = c.stream_id AND r.reader = %s "
                 "WHERE c.stream_id = %s FOR SHARE OF c")
        row = conn.execute(query, (reader, stream_id)).fetchone()
        if row is None:
            _ensure_row(conn, stream_id)
            row = conn.execute(query, (reader, stream_id)).fetchone()
        assert row is not None  # noqa: S101 - the row was just ensured
        held = None if row[4] is None else (row[4], row[5])
        # A registration at or below ``position`` (of a reader no less demanding) has held
        # compaction since it was checked: nothing the reader needs went since. Otherwise
        # (new, lost, moving back, now keeping history) what compaction removed is checked.
        if held is None or int(held[0]) > position or (history and not held[1]):
            error = _behind(reader, stream, position, history, int(row[0]), int(row[1]),
                            int(row[2]), row[3])
            if error is not None:
                raise error
        conn.execute(
            "INSERT INTO lakefold.changelog_readers (reader, stream_id, position, history) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (reader, stream_id) DO UPDATE SET "
            "position = EXCLUDED.position, history = EXCLUDED.history, moved_at = CASE "
            "WHEN lakefold.changelog_readers.position = EXCLUDED.position "
            "THEN lakefold.changelog_readers.moved_at ELSE now() END",
            (reader, stream_id, position, history))


def release(conn: psycopg.Connection[Any], reader: str, stream_id: int | None = None) -> int:
    """Forget ``reader`` (in one stream, or in all): it no longer holds compaction. Returns
    how many registrations went."""
    if stream_id is None:
        cur = conn.execute("DELETE FROM lakefold.changelog_readers WHERE reader = %s", (reader,))
    else:
        cur = conn.execute("DELETE FROM lakefold.changelog_readers WHERE reader = %s "
                           "AND stream_id = %s", (reader, stream_id))
    return max(cur.rowcount, 0)


def readers(conn: psycopg.Connection[Any], stream_id: int | None = None
            ) -> list[ReaderPosition]:
    """Durable readers (of one stream, or of all), lowest position first."""
    rows = conn.execute(
        "SELECT r.reader, s.name, r.position, r.history, r.registered_at, r.moved_at "
        "FROM lakefold.changelog_readers r JOIN lakefold.changelog_streams s USING (stream_id) "
        "WHERE %(s)s::integer IS NULL OR r.stream_id = %(s)s "
        "ORDER BY s.name, r.position, r.moved_at, r.reader", {"s": stream_id}).fetchall()
    return [ReaderPosition(r[0], r[1], int(r[2]), bool(r[3]), r[4], r[5]) for r in rows]


def state(conn: psycopg.Connection[Any], stream_id: int, stream: str) -> CompactionState:
    """The stream's compaction state and readers (zeros for a stream never compacted)."""
    row = conn.execute(
        "SELECT compacted_to, removed, removed_to, expired_to, last_run, keep_history IS TRUE, "
        "keep_history_reason FROM lakefold.changelog_compaction WHERE stream_id = %s",
        (stream_id,)).fetchone()
    values = row if row is not None else (0, 0, 0, 0, None, False, None)
    return CompactionState(stream, int(values[0]), int(values[1]), int(values[2]),
                           int(values[3]), values[4], bool(values[5]), values[6],
                           tuple(readers(conn, stream_id)))


def set_keep_history(conn: psycopg.Connection[Any], stream_id: int, keep: bool,
                     reason: str, *, if_unset: bool = False) -> bool:
    """Make a stream keep its full history (no compaction) or not, saying why; with
    ``if_unset`` only when nobody decided yet (a user's ``keep_history(False)`` stands).
    True when this changed the setting."""
    with conn.transaction():
        _ensure_row(conn, stream_id)
        cur = conn.execute(
            "UPDATE lakefold.changelog_compaction SET keep_history = %s, "
            "keep_history_reason = %s WHERE stream_id = %s AND CASE WHEN %s "
            "THEN keep_history IS NULL ELSE keep_history IS DISTINCT FROM %s END",
            (keep, reason, stream_id, if_unset, keep))
    return cur.rowcount > 0


def lock_for_compaction(conn: psycopg.Connection[Any], stream_id: int
                        ) -> tuple[bool, int | None]:
    """Inside a compaction chunk's transaction, before it removes anything: lock the stream's
    compaction row (readers registering wait for the chunk) and return (keep_history, the
    lowest reader position or None when no reader holds the stream)."""
    row = conn.execute("SELECT keep_history IS TRUE FROM lakefold.changelog_compaction "
                       "WHERE stream_id = %s FOR UPDATE", (stream_id,)).fetchone()
    if row is None:
        return False, None
    # A statement of its own: its snapshot is taken after the lock was granted, so it sees
    # every reader that registered while this chunk waited for the lock.
    lowest = conn.execute("SELECT min(position) FROM lakefold.changelog_readers "
                          "WHERE stream_id = %s", (stream_id,)).fetchone()
    return bool(row[0]), None if lowest is None or lowest[0] is None else int(lowest[0])
