"""The windows of a view generation that are not final yet, so that the batch in which the
watermark passes a window's end finds it and writes its row once more, final (see
``_windows``). One row per open window start, per generation; a batch adds the windows its
events fell in and takes out, in the same transaction, those the watermark has passed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import psycopg

_DDL: Final = """CREATE TABLE IF NOT EXISTS lakefold.view_open_windows (
    owner text NOT NULL,
    window_start bigint NOT NULL,
    PRIMARY KEY (owner, window_start))"""


def install_window_book(conn: psycopg.Connection[Any]) -> None:
    """Create the table (idempotent)."""
    with conn.transaction():
        conn.execute(_DDL)


def open_windows(conn: psycopg.Connection[Any], owner: str, starts: Iterable[int]) -> None:
    """Note windows (starts in microseconds since the epoch) as holding rows, not final."""
    wanted = sorted(set(starts))
    if wanted:
        conn.execute("INSERT INTO lakefold.view_open_windows (owner, window_start) "
                     "SELECT %s, unnest(%s::bigint[]) ON CONFLICT DO NOTHING", (owner, wanted))


def close_windows(conn: psycopg.Connection[Any], owner: str, through: int) -> list[int]:
    """Take out, and return, the open windows that start at or before ``through``."""
    rows = conn.execute("DELETE FROM lakefold.view_open_windows WHERE owner = %s AND "
                        "window_start <= %s RETURNING window_start", (owner, through))
    return sorted(int(r[0]) for r in rows.fetchall())


def forget_windows(conn: psycopg.Connection[Any], owner: str) -> None:
    """Delete a generation's open windows (when it is dropped)."""
    with conn.transaction():
        conn.execute(_DDL)
        conn.execute("DELETE FROM lakefold.view_open_windows WHERE owner = %s", (owner,))
