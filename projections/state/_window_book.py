"""The windows of a view generation that are not final yet, so that the batch in which the
watermark passes a window's end finds it and writes its row once more, final (see
``_windows``). One row per open window start, per generation; a batch adds the windows its
events fell in and takes out, in the same transaction, those the watermark has passed. A
session's end moves as it grows (``_session_windows``), so a session keeps its end here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import psycopg
from psycopg import sql

from lakefold.core import migrations
from lakefold.core.migrations import Migration

_DDL: Final = ["""CREATE TABLE IF NOT EXISTS lakefold.view_open_windows (
    owner text NOT NULL,
    window_start bigint NOT NULL,
    PRIMARY KEY (owner, window_start))""",
    # A session's end (``_session_windows``); added after the first release.
    "ALTER TABLE lakefold.view_open_windows ADD COLUMN IF NOT EXISTS window_end bigint"]
COMPONENT: Final = migrations.register(
    "view_open_windows", Migration(1, "open windows of view generations", *_DDL))


def install_window_book(conn: psycopg.Connection[Any]) -> None:
    """Create the table (idempotent; migrates component ``view_open_windows``)."""
    migrations.migrate(conn, COMPONENT)


def open_windows(conn: psycopg.Connection[Any], owner: str, starts: Iterable[int],
                 ends: Mapping[int, int] | None = None) -> None:
    """Note windows (starts in microseconds since the epoch) as holding rows, not final;
    ``ends``: of sessions, start → end (a later end replaces an earlier one)."""
    wanted = sorted(set(starts))
    if wanted:
        conn.execute("INSERT INTO lakefold.view_open_windows (owner, window_start, window_end) "
                     "SELECT %s, s, e FROM unnest(%s::bigint[], %s::bigint[]) AS w(s, e) "
                     "ON CONFLICT (owner, window_start) DO UPDATE SET window_end = "
                     "greatest(view_open_windows.window_end, excluded.window_end)",
                     (owner, wanted, [None if ends is None else ends.get(s) for s in wanted]))


def close_windows(conn: psycopg.Connection[Any], owner: str, through: int, *,
                  by_end: bool = False) -> list[int]:
    """Take out, and return, the open windows that start at or before ``through`` (with
    ``by_end``: the sessions that end at or before it)."""
    column = sql.Identifier("window_end" if by_end else "window_start")
    rows = conn.execute(sql.SQL("DELETE FROM lakefold.view_open_windows WHERE owner = %s AND "
                                "{} <= %s RETURNING window_start").format(column),
                        (owner, through))
    return sorted(int(r[0]) for r in rows.fetchall())


def forget_windows(conn: psycopg.Connection[Any], owner: str) -> None:
    """Delete a generation's open windows (when it is dropped)."""
    with conn.transaction():
        migrations.migrate(conn, COMPONENT)
        conn.execute("DELETE FROM lakefold.view_open_windows WHERE owner = %s", (owner,))
