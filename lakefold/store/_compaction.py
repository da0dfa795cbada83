"""Online compaction of changelog streams: the latest record per key stays, tombstones go
after a retention period.

The capture appends without any index on keys (that keeps appends fast). Compaction keeps its
own map ``lakefold.changelog_keys`` from key to the latest compacted position, like the offset
map of Kafka's log cleaner, and works through the new records in chunks of positions
``(compacted_to, head]``. Per chunk, in ONE short transaction:

1. the latest record of each key in the chunk is found (one scan of the chunk, a window per
   key);
2. older records of those keys inside the chunk are deleted, and so are the records the key
   map pointed to (primary-key probes only, whatever the statistics say; see ``_CHUNK``);
3. the key map is updated and ``compacted_to`` advanced;
4. a truncate record in the chunk deletes every record before it, and empties the key map
   below it.

Snapshot segments (``_snapshot_segments``) holding positions of the chunk become ordinary records
first, in the same transaction, so the steps above see every record.

Then tombstones (deletes) and truncate records below ``compacted_to`` whose commit is older
than the retention are removed with their key map entries.

Durable readers (``_reader_registry``: projection generations, subscriptions) hold compaction back:
a chunk never reaches past the lowest position a reader of the stream has processed, and
tombstones are expired only below it, so a slow or paused reader still reads every update and
delete it has not processed. The highest position of any removed record (``removed_to``) and
of any expired tombstone (``expired_to``) are recorded, which is how a reader that falls behind
them is detected. A stream that keeps its full history is not compacted at all.

Compaction never touches records above the head (where the capture appends), takes no table
locks, and only short row locks; readers keep their MVCC snapshots. After a full run, reading
the stream from position 1 yields exactly one record per live key (its latest insert, update
or snapshot read), plus tombstones still within retention (and everything after the
lowest reader position). A consumer that is not a registered reader must read a tombstone
within the retention period to learn of the delete (as with Kafka's
``delete.retention.ms``); a slower one should rebuild from the compacted stream.

Only one compaction of a stream runs at a time (advisory lock); a second one skips it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

import psycopg

from lakefold.store import _reader_registry, _snapshot_segments
from lakefold.store.exceptions import CaptureValueError

log = logging.getLogger(__name__)

_LOCK_SPACE: Final = 0x6C66636D  # "lfcm"

# Every record this query deletes or maps is found by a primary-key probe with an array
# (``= ANY (ARRAY(...))``, an index condition), never by a join against a CTE: a CTE cannot be
# probed, so a nested loop with one on its inner side is quadratic, and the planner takes one
# whenever it estimates a side at one row, which stale statistics make it do (a histogram of
# positions taken before the chunk was written: 200,000 records took minutes, not a second).
_CHUNK: Final = """
WITH chunk AS (
    SELECT position, key, max(position) OVER (PARTITION BY key) AS newest
    FROM lakefold.changelog
    WHERE stream_id = %(s)s AND position > %(lo)s AND position <= %(hi)s AND key IS NOT NULL
), latest AS (
    SELECT key, position FROM chunk WHERE position = newest
), older_in_chunk AS (
    DELETE FROM lakefold.changelog
    WHERE stream_id = %(s)s
      AND position = ANY (ARRAY(SELECT position FROM chunk WHERE position < newest))
    RETURNING position
), previous AS (
    DELETE FROM lakefold.changelog
    WHERE stream_id = %(s)s AND position = ANY (ARRAY(
        SELECT position FROM lakefold.changelog_keys
        WHERE stream_id = %(s)s AND key = ANY (ARRAY(SELECT key FROM latest))))
    RETURNING position
), mapped AS (
    INSERT INTO lakefold.changelog_keys (stream_id, key, position)
    SELECT %(s)s, key, position FROM latest
    ON CONFLICT (stream_id, key) DO UPDATE SET position = EXCLUDED.position
    RETURNING 1
)
SELECT (SELECT count(*) FROM older_in_chunk) + (SELECT count(*) FROM previous),
       (SELECT count(*) FROM mapped),
       coalesce(greatest((SELECT max(position) FROM older_in_chunk),
                         (SELECT max(position) FROM previous)), 0)
"""

# An expired tombstone at or below ``done`` is its key's latest compacted record, so the key
# map points at it: the key alone finds the entry (probed with an array, as above).
_EXPIRE: Final = """
WITH gone AS (
    DELETE FROM lakefold.changelog WHERE stream_id = %(s)s AND op IN ('d', 't')
      AND position <= %(done)s AND commit_ts < now() - %(retention)s
    RETURNING key, position
), unmapped AS (
    DELETE FROM lakefold.changelog_keys
    WHERE stream_id = %(s)s AND position <= %(done)s
      AND key = ANY (ARRAY(SELECT key FROM gone WHERE key IS NOT NULL))
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM unmapped),
       coalesce((SELECT max(position) FROM gone), 0)
"""


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """Background compaction during ``Capture.run``: every ``interval``, keep the latest
    record per key and drop tombstones older than ``tombstone_retention``."""

    interval: timedelta = timedelta(minutes=5)
    tombstone_retention: timedelta = timedelta(hours=24)
    chunk_positions: int = 50_000


def default_retention() -> timedelta:
    return CompactionPolicy().tombstone_retention


def compact_stream(conn: psycopg.Connection[Any], stream_id: int, *, retention: timedelta,
                   chunk_positions: int = 50_000) -> int:
    """Compact one stream (see the module docstring); returns how many records were removed,
    or 0 when another compaction of the stream holds the lock. ``conn`` is autocommit."""
    if retention < timedelta(0):
        raise CaptureValueError(f"tombstone retention must not be negative, got {retention}")
    if chunk_positions < 1:
        raise CaptureValueError(f"chunk_positions must be at least 1, got {chunk_positions}")
    locked = conn.execute("SELECT pg_try_advisory_lock(%s, %s)",
                          (_LOCK_SPACE, stream_id)).fetchone()
    if not locked or not locked[0]:
        log.info("stream %d is being compacted by another process; skipped", stream_id)
        return 0
    try:
        return _compact_locked(conn, stream_id, retention, chunk_positions)
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s, %s)", (_LOCK_SPACE, stream_id))


def _compact_locked(conn: psycopg.Connection[Any], stream_id: int, retention: timedelta,
                    chunk: int) -> int:
    conn.execute("INSERT INTO lakefold.changelog_compaction (stream_id) VALUES (%s) "
                 "ON CONFLICT DO NOTHING", (stream_id,))
    row = conn.execute(
        "SELECT c.compacted_to, s.head, s.name FROM lakefold.changelog_compaction c "
        "JOIN lakefold.changelog_streams s USING (stream_id) WHERE stream_id = %s",
        (stream_id,),
    ).fetchone()
    if row is None:
        return 0
    done, head, name = int(row[0]), int(row[1]), str(row[2])
    removed = 0
    held: int | None = None
    while done < head:
        with conn.transaction(), conn.cursor() as cur:
            keep_history, lowest = _reader_registry.lock_for_compaction(conn, stream_id)
            if keep_history:
                log.info("stream %s keeps its full history; not compacted", name)
                return removed
            upper = min(head, done + chunk)
            if lowest is not None and lowest < upper:
                held, upper = lowest, lowest
            if upper <= done:
                break
            _snapshot_segments.explode(cur, stream_id, done, upper)
            counts = cur.execute(_CHUNK, {"s": stream_id, "lo": done, "hi": upper}).fetchone()
            chunk_removed = int(counts[0]) if counts else 0
            removed_to = int(counts[2]) if counts else 0
            truncated, truncated_to = _apply_truncate(conn, stream_id, done, upper)
            conn.execute(
                "UPDATE lakefold.changelog_compaction SET compacted_to = %s, "
                "removed = removed + %s, removed_to = greatest(removed_to, %s), "
                "last_run = now() WHERE stream_id = %s",
                (upper, chunk_removed + truncated, max(removed_to, truncated_to), stream_id),
            )
        removed += chunk_removed + truncated
        done = upper
    if held is not None and held < head:
        _report_hold(conn, stream_id, name, retention)
    with conn.transaction():
        keep_history, lowest = _reader_registry.lock_for_compaction(conn, stream_id)
        if keep_history:
            return removed
        limit = done if lowest is None else min(done, lowest)
        counts = conn.execute(_EXPIRE, {"s": stream_id, "done": limit,
                                        "retention": retention}).fetchone()
        expired = int(counts[0]) if counts else 0
        expired_to = int(counts[2]) if counts else 0
        conn.execute(
            "UPDATE lakefold.changelog_compaction SET removed = removed + %s, "
            "removed_to = greatest(removed_to, %s), expired_to = greatest(expired_to, %s), "
            "last_run = now() WHERE stream_id = %s",
            (expired, expired_to, expired_to, stream_id))
    return removed + expired


def _report_hold(conn: psycopg.Connection[Any], stream_id: int, name: str,
                 retention: timedelta) -> None:
    """Say which reader holds the stream's compaction; a warning when it has not moved for
    longer than the tombstone retention (it may be gone for good, or paused for days)."""
    holder = next(iter(_reader_registry.readers(conn, stream_id)), None)
    if holder is None:
        return
    row = conn.execute("SELECT now() - %s > %s", (holder.moved_at, retention)).fetchone()
    if row is not None and row[0]:
        log.warning(
            "compaction of %s is held at position %d by reader %s, which has not moved since "
            "%s (longer than the tombstone retention %s); if it is gone for good, release it "
            "with `lakefold capture release-reader %s`", name, holder.position, holder.reader,
            holder.moved_at.isoformat(), retention, holder.reader)
    else:
        log.info("compaction of %s is held at position %d by reader %s", name,
                 holder.position, holder.reader)


def _apply_truncate(conn: psycopg.Connection[Any], stream_id: int, lo: int, hi: int
                    ) -> tuple[int, int]:
    """A truncate record in ``(lo, hi]`` supersedes every earlier record of the stream;
    returns (records removed, the highest position removed or 0)."""
    row = conn.execute(
        "SELECT max(position) FROM lakefold.changelog WHERE stream_id = %s AND op = 't' "
        "AND position > %s AND position <= %s", (stream_id, lo, hi),
    ).fetchone()
    if row is None or row[0] is None:
        return 0, 0
    gone = conn.execute(
        "WITH gone AS (DELETE FROM lakefold.changelog WHERE stream_id = %s AND position < %s "
        "RETURNING position) SELECT count(*), coalesce(max(position), 0) FROM gone",
        (stream_id, row[0])).fetchone()
    conn.execute("DELETE FROM lakefold.changelog_keys WHERE stream_id = %s AND position < %s",
                 (stream_id, row[0]))
    return (int(gone[0]), int(gone[1])) if gone else (0, 0)


class BackgroundCompactor:
    """Compacts every stream of a slot every ``policy.interval`` in a daemon thread, until
    ``stop()``. Errors are logged and retried at the next interval; ``last_error`` keeps the
    latest one."""

    def __init__(self, dsn: str, policy: CompactionPolicy, *, slot: str) -> None:
        self._dsn = dsn
        self._policy = policy
        self._slot = slot
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lakefold-compact-{slot}",
                                        daemon=True)
        self.runs = 0
        self.removed = 0
        self.last_error: str | None = None

    def start(self) -> BackgroundCompactor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def run_once(self) -> int:
        """Compact all streams of the slot once; returns records removed."""
        removed = 0
        with psycopg.connect(self._dsn, autocommit=True, connect_timeout=10) as conn:
            ids = [r[0] for r in conn.execute(
                "SELECT stream_id FROM lakefold.changelog_streams WHERE slot_name = %s",
                (self._slot,)).fetchall()]
            for stream_id in ids:
                if self._stop.is_set():
                    break
                removed += compact_stream(conn, stream_id,
                                          retention=self._policy.tombstone_retention,
                                          chunk_positions=self._policy.chunk_positions)
        self.runs += 1
        self.removed += removed
        return removed

    def _run(self) -> None:
        while not self._stop.wait(self._policy.interval.total_seconds()):
            try:
                self.run_once()
                self.last_error = None
            except psycopg.Error as e:
                self.last_error = str(e)
                log.error("compaction of slot %s failed: %s; retrying in %s", self._slot, e,
                          self._policy.interval)
