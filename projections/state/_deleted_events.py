"""Deleted events keep their place in time: the event times of the events a view read before
their stream was deleted, so that a rebuild decides lateness and sessions as the live run did.

A deleted stream's events leave every view (their rows are deleted), but the live run read
them before the deletion: they moved its watermark, and a session's shape (where it starts, what
it merged) may come from one of them. A rebuild reads the store as it is now, without them. So
when a view's feed reads a stream's deletion, it records the times of that stream's events it
had fed (``record``), once per view (not per generation: the record outlives the generation
that wrote it), and every feed of the view takes them into account where they were in the log
(``in_range``, ``of_keys``): they move the watermark and shape sessions, and are never
counted. Live and rebuild then classify every event alike, however either batched the events.

An event deleted before the view read it never moved the live watermark, and a rebuild does not
see it either: nothing is recorded. For a rebuild to find the records of every event the live
run read, a rebuild never reads past the live generation, and waits while the live generation
has not yet read a deletion that is in the store (``_view_events``, ``EventFeed.read``).

Rows are keyed by the view, its input, the column the time was read from (with the columns a
session is by: another definition reads other times) and the event's position.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import psycopg

from lakefold.core import migrations
from lakefold.core.migrations import Migration

_DDL: Final = [
    """CREATE TABLE IF NOT EXISTS lakefold.deleted_event_times (
        view text NOT NULL,
        input text NOT NULL,
        time_column text NOT NULL,
        position bigint NOT NULL,
        event_time bigint NOT NULL,
        session_key text,
        PRIMARY KEY (view, input, time_column, position))""",
]
COMPONENT: Final = migrations.register(
    "deleted_event_times", Migration(1, "times of deleted events", *_DDL))


@dataclass(frozen=True)
class TimeSource:
    """Where a feed reads its events' times: the view, its input, the time column and (of a
    session) the columns it is by."""

    view: str
    input: str
    column: str
    by: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return "|".join((self.column, *self.by))


@dataclass(frozen=True)
class DeletedTimes:
    """Recorded times of deleted events: positions (ascending), times (microseconds since the
    epoch) and, of a session, each event's key (a tuple of its ``by`` values)."""

    positions: np.ndarray
    times: np.ndarray
    keys: list[tuple[Any, ...]]

    @property
    def empty(self) -> bool:
        return len(self.positions) == 0

    def prefix_max(self, positions: np.ndarray) -> np.ndarray:
        """For each of ``positions`` (ascending), the largest time recorded at a position
        before it (``np.iinfo(np.int64).min`` where none)."""
        floor = np.iinfo(np.int64).min
        if self.empty:
            return np.full(len(positions), floor, dtype=np.int64)
        running = np.maximum.accumulate(self.times)
        before = np.searchsorted(self.positions, positions, side="left")
        padded = np.concatenate([[floor], running])
        return padded[before].astype(np.int64)

    @property
    def top(self) -> int | None:
        return None if self.empty else int(self.times.max())


def install_deleted_times(conn: psycopg.Connection[Any]) -> None:
    """Create the table (idempotent, concurrency-safe)."""
    migrations.migrate(conn, COMPONENT)


def record(conn: psycopg.Connection[Any], source: TimeSource, positions: Sequence[int],
           times: Sequence[int], keys: Sequence[tuple[Any, ...]] | None = None) -> None:
    """Record the times of deleted events a feed had read (in the caller's transaction; a
    position recorded before stays as it was)."""
    if not len(positions):
        return
    texts = [None] * len(positions) if keys is None else \
        [json.dumps(list(k), default=str) for k in keys]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO lakefold.deleted_event_times (view, input, time_column, position, "
            "event_time, session_key) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            [(source.view, source.input, source.name, int(p), int(t), k)
             for p, t, k in zip(positions, times, texts, strict=True)])


def _found(rows: list[tuple[Any, ...]]) -> DeletedTimes:
    return DeletedTimes(np.array([int(r[0]) for r in rows], dtype=np.int64),
                        np.array([int(r[1]) for r in rows], dtype=np.int64),
                        [tuple(json.loads(r[2])) if r[2] is not None else () for r in rows])


def in_range(conn: psycopg.Connection[Any], source: TimeSource, start: int,
             end: int) -> DeletedTimes:
    """The recorded deleted events at positions ``[start, end)``."""
    return _found(conn.execute(
        "SELECT position, event_time, session_key FROM lakefold.deleted_event_times "
        "WHERE view = %s AND input = %s AND time_column = %s AND position >= %s "
        "AND position < %s ORDER BY position",
        (source.view, source.input, source.name, start, end)).fetchall())


def of_keys(conn: psycopg.Connection[Any], source: TimeSource, keys: Sequence[tuple[Any, ...]],
            before: int) -> DeletedTimes:
    """The recorded deleted events of the sessions of ``keys`` at positions before
    ``before``."""
    if not keys:
        return _found([])
    texts = sorted({json.dumps(list(k), default=str) for k in keys})
    return _found(conn.execute(
        "SELECT position, event_time, session_key FROM lakefold.deleted_event_times "
        "WHERE view = %s AND input = %s AND time_column = %s AND session_key = ANY(%s) "
        "AND position < %s ORDER BY position",
        (source.view, source.input, source.name, texts, before)).fetchall())
