"""Sealing: writing the segments of complete ranges of the log (see ``_segments.py``).

``seal(dsn)`` seals every complete range without a segment, oldest first (``EventStore.seal()``
and ``lakefold events seal`` call it); ``BackgroundSealer`` does so in a daemon thread of each
``EventStore`` soon after its sequencing rounds complete a range, and after its deletions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Final

import psycopg
import pyarrow as pa

from lakefold.core import adbc
from lakefold.core.dsn import mask_dsn
from lakefold.eventstore._arrow import EVENTS_ARROW_SCHEMA, read_rows
from lakefold.eventstore._background import WakeableThread
from lakefold.eventstore._ddl import SEAL_LOCK_KEY
from lakefold.eventstore._model import Sealed
from lakefold.eventstore._readers import open_reader
from lakefold.eventstore._segments import BOUNDS, SEGMENT_POSITIONS, encode, unsealed_ranges
from lakefold.eventstore._sequencer import sequence_once
from lakefold.eventstore._translate import translate_errors
from lakefold.eventstore.exceptions import EventStoreTerminalError

logger = logging.getLogger(__name__)

_INSERT: Final = (
    "INSERT INTO lakefold.event_segments (first_position, end_position, events, data) "
    "VALUES (%s, %s, %s, %b)"
)


def _seal_one(conn: psycopg.Connection[Any], reader: adbc.Connection, start: int, end: int
              ) -> int | None:
    """Seal ``[start, end)``; the events written, or None when a deletion holds the lock."""
    with conn.transaction():
        locked = conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (SEAL_LOCK_KEY,)).fetchone()
        if not (locked and locked[0]):
            return None
        overlap = conn.execute(BOUNDS + "WHERE first_position < %s AND end_position > %s",
                               (end, start)).fetchone()
        if overlap is not None:  # another sealer was first
            return 0
        # The read runs on the reader's session after the lock was taken, so it sees every
        # deletion committed before, and none can commit until this transaction ends.
        table = pa.Table.from_batches(
            list(read_rows(reader, conn, start, end, schema=EVENTS_ARROW_SCHEMA)),
            schema=EVENTS_ARROW_SCHEMA)
        conn.execute(_INSERT, (start, end, table.num_rows, encode(table)))
        return int(table.num_rows)


def seal(dsn: str, *, size: int = SEGMENT_POSITIONS, stop: threading.Event | None = None,
         progress: Callable[[int, int], None] | None = None) -> Sealed:
    """Seal every complete range of the log that has no segment yet, oldest first, until
    ``stop`` is set, calling ``progress(done, total)`` after each range; see
    ``_segments.py``. Safe to run from several processes at once.
    Raises EventStoreUnavailableError, or EventStoreNotInstalledError (also for a store
    installed by a lakefold without segments: ``install()`` upgrades it)."""
    masked = mask_dsn(dsn)
    segments = events = 0
    with translate_errors(masked), psycopg.connect(dsn, autocommit=True) as conn:
        head = sequence_once(conn).head
        bounds = [(int(a), int(b)) for a, b in conn.execute(BOUNDS + "ORDER BY 1")]
        todo = unsealed_ranges(bounds, head, size)
        if not todo:
            return Sealed(head=head)
        with open_reader(dsn) as reader:
            for done, (start, end) in enumerate(todo, start=1):
                if stop is not None and stop.is_set():
                    return Sealed(segments, events, head, interrupted=True)
                written = _seal_one(conn, reader, start, end)
                if written is None:
                    return Sealed(segments, events, head, interrupted=True)
                segments += 1 if written else 0
                events += written
                if progress is not None:
                    progress(done, len(todo))
    return Sealed(segments, events, head)


class BackgroundSealer(WakeableThread):
    """A daemon thread that seals ranges soon after the head completes them (``notice``) and
    after deletions (``poke``). Failures are logged and retried at a later wake-up; a store
    without the segments table (installed by an older lakefold) is reported once, and the
    thread ends."""

    def __init__(self, dsn: str, *, size: int = SEGMENT_POSITIONS) -> None:
        super().__init__("lakefold-sealer", join_timeout_s=60)
        self._dsn = dsn
        self._size = size
        self._next_end = 0  # wake when head + 1 reaches this: a block is complete

    def notice(self, head: int) -> None:
        """The head is now ``head``: wake the thread if that completes a block."""
        if head + 1 >= self._next_end:
            self.poke()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                result = seal(self._dsn, size=self._size, stop=self._stop)
            except EventStoreTerminalError as e:
                logger.warning("event segments are not sealed: %s", e)
                return
            except Exception as e:  # the server went away, say: a later wake-up retries
                logger.warning("sealing event segments failed (%s: %s); retrying later",
                               type(e).__name__, e)
                self._stop.wait(1.0)
                continue
            if result.interrupted:  # a deletion is under way: try again a little later
                self._stop.wait(0.5)
                self._wake.set()
            else:
                self._next_end = (result.head // self._size + 1) * self._size + 1
