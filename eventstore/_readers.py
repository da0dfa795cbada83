"""Connections for bulk reads of the log, kept for the next read in the same process.

A bulk read (``read_events_range``) needs an ADBC connection, which fetches rows as Arrow, and
a psycopg one, which quotes the literals of the log read. Opening the pair costs ~40 ms (ADBC
looks up the server's types on connect), as much as reading 100k sealed events; a Spark
Python worker runs many reads one after the other. So a read that ends cleanly leaves its
pair here, and the next read of the same DSN in the process takes it after a liveness check
(a round trip on each connection). A read that fails or is abandoned closes its pair.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import psycopg

from lakefold.core import adbc
from lakefold.core.dsn import error_text, mask_dsn
from lakefold.eventstore.exceptions import EventStoreUnavailableError

# The log read orders by its primary key under a LIMIT; with a fresh table's statistics the
# planner picked a bitmap scan plus an on-disk sort (2x slower than the ordered index scan),
# and parallel workers only compete with Spark's own tasks.
_SETTINGS: Final = ("SET enable_sort = off", "SET enable_bitmapscan = off",
                    "SET max_parallel_workers_per_gather = 0")
#: Idle pairs kept in all (a Spark worker reads one store, one read at a time).
_KEEP: Final = 2

Pair = tuple[psycopg.Connection[Any], adbc.Connection]

_idle: list[tuple[str, Pair]] = []  # oldest first
_lock = threading.Lock()


def open_reader(dsn: str) -> adbc.Connection:
    """A new ADBC connection for bulk reads of the log; EventStoreUnavailableError when it fails."""
    try:
        reader = adbc.Connection(dsn)
    except adbc.Error as e:
        raise EventStoreUnavailableError(
            f"cannot connect to the event store at {mask_dsn(dsn)}: {error_text(e)}; "
            "check the DSN and that the server runs"
        ) from e
    try:
        for setting in _SETTINGS:
            reader.execute(setting)
    except BaseException:
        reader.close()
        raise
    return reader


def _close(pair: Pair) -> None:
    conn, reader = pair
    conn.close()
    reader.close()


def _alive(pair: Pair) -> bool:
    conn, reader = pair
    try:
        conn.execute("SELECT 1")
        reader.execute(_SETTINGS[0])
    except (psycopg.Error, adbc.Error):
        _close(pair)
        return False
    return True


def _take(dsn: str) -> Pair | None:
    while True:
        with _lock:
            found = next((i for i in range(len(_idle) - 1, -1, -1) if _idle[i][0] == dsn), None)
            if found is None:
                return None
            _, pair = _idle.pop(found)
        if _alive(pair):
            return pair


def _give(dsn: str, pair: Pair) -> None:
    with _lock:
        _idle.append((dsn, pair))
        evicted = _idle.pop(0)[1] if len(_idle) > _KEEP else None
    if evicted is not None:
        _close(evicted)


@atexit.register
def close_idle() -> None:
    """Close every idle pair (at exit, and for tests)."""
    with _lock:
        pairs = [pair for _, pair in _idle]
        _idle.clear()
    for pair in pairs:
        _close(pair)


@contextmanager
def read_connections(dsn: str) -> Iterator[Pair]:
    """A (psycopg, ADBC) pair for one read, reused from an earlier read of ``dsn`` in this
    process when one is idle. The caller ends any transaction it began before the block
    ends; a block that raises (or a generator closed inside it) closes the pair."""
    pair = _take(dsn)
    if pair is None:
        conn = psycopg.connect(dsn, autocommit=True)
        try:
            pair = (conn, open_reader(dsn))
        except BaseException:
            conn.close()
            raise
    try:
        yield pair
    except BaseException:
        _close(pair)
        raise
    _give(dsn, pair)
