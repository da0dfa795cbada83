"""Online compaction of changelog streams: the latest record per key stays, tombstones go
after a retention period.

How it works, per stream, in short transactions that never touch records above the head
(where the capture appends) and take no table locks:

1. For each chunk of positions ``(compacted_to, head]``: delete every older record whose key
   has a newer record in the chunk; records before a truncate record in the chunk are deleted
   too. ``compacted_to`` advances in the same transaction, so an interrupted compaction
   resumes where it stopped.
2. Tombstones (deletes) and truncate records below ``compacted_to`` whose commit is older
   than the retention are deleted: after step 1 they are the latest record of their key.

After a full run, reading the stream from position 1 yields exactly one record per live key
(its latest insert/update/read), plus tombstones still within retention. A consumer must read
a tombstone within the retention period to learn of the delete; slower consumers should
rebuild from the compacted stream (as with Kafka's ``delete.retention.ms``).

Only one compaction of a stream runs at a time (advisory lock); a second one skips it.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any, Final

import psycopg

from lakefold.capture._config import CompactionPolicy

log = logging.getLogger(__name__)

_LOCK_SPACE: Final = 0x6C66636D  # "lfcm"


def default_retention() -> timedelta:
    return CompactionPolicy().tombstone_retention


def compact_stream(conn: psycopg.Connection[Any], stream_id: int, *, retention: timedelta,
                   chunk_positions: int = 50_000) -> int:
    """Compact one stream (see the module docstring); returns how many records were removed,
    or 0 when another compaction of the stream holds the lock. ``conn`` is autocommit."""
    if retention < timedelta(0):
        raise ValueError(f"tombstone retention must not be negative, got {retention}")
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
        "SELECT c.compacted_to, s.head FROM lakefold.changelog_compaction c "
        "JOIN lakefold.changelog_streams s USING (stream_id) WHERE stream_id = %s",
        (stream_id,),
    ).fetchone()
    if row is None:
        return 0
    done, head = int(row[0]), int(row[1])
    removed = 0
    while done < head:
        upper = min(head, done + chunk)
        with conn.transaction():
            cur = conn.execute(
                "DELETE FROM lakefold.changelog o USING ("
                "  SELECT key, max(position) AS latest FROM lakefold.changelog "
                "  WHERE stream_id = %(s)s AND position > %(lo)s AND position <= %(hi)s "
                "  AND key IS NOT NULL GROUP BY key) n "
                "WHERE o.stream_id = %(s)s AND o.key = n.key AND o.position < n.latest",
                {"s": stream_id, "lo": done, "hi": upper},
            )
            chunk_removed = max(cur.rowcount, 0)
            truncate = conn.execute(
                "SELECT max(position) FROM lakefold.changelog WHERE stream_id = %s "
                "AND op = 't' AND position > %s AND position <= %s",
                (stream_id, done, upper),
            ).fetchone()
            if truncate is not None and truncate[0] is not None:
                cur = conn.execute(
                    "DELETE FROM lakefold.changelog WHERE stream_id = %s AND position < %s",
                    (stream_id, truncate[0]),
                )
                chunk_removed += max(cur.rowcount, 0)
            conn.execute(
                "UPDATE lakefold.changelog_compaction SET compacted_to = %s, "
                "removed = removed + %s, last_run = now() WHERE stream_id = %s",
                (upper, chunk_removed, stream_id),
            )
        removed += chunk_removed
        done = upper
    with conn.transaction():
        cur = conn.execute(
            "DELETE FROM lakefold.changelog WHERE stream_id = %s AND op IN ('d', 't') "
            "AND position <= %s AND commit_ts < now() - %s",
            (stream_id, done, retention),
        )
        expired = max(cur.rowcount, 0)
        conn.execute(
            "UPDATE lakefold.changelog_compaction SET removed = removed + %s, last_run = now() "
            "WHERE stream_id = %s", (expired, stream_id))
    return removed + expired


class BackgroundCompactor:
    """Compacts every stream of a slot every ``policy.interval`` in a daemon thread, until
    ``stop()``. Errors are logged with the stream and retried at the next interval."""

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
