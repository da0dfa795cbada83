"""Commit points in the changelog: how far the store holds every source transaction, and where
in a stream the records of later transactions begin.

The capture stores a source's transactions in commit order and moves the heads of every stream
a transaction touched in one store transaction (with the slot's ``commit_lsn``). So every
record whose commit LSN is at most the slot's stored commit LSN (less one while the slot's last
transaction is only partly stored), or at most the newest commit LSN at a stream's head, is
visible in its stream, now and for every later reader: ``frontier``. A reader that ends a
range at ``first_after`` of such a frontier holds, of every source transaction, all of its
records in that stream or none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg


def frontier(conn: psycopg.Connection[Any], streams: Sequence[str]) -> int | None:
    """The commit LSN up to which the store holds every transaction of the source of
    ``streams``: the slot's stored commit LSN (less one while its last transaction is only
    partly stored), or the newest commit LSN at the streams' heads when that is later (a
    snapshot's records carry the snapshot's LSN; no transaction before it is still to come).
    None when the streams come from more than one slot (their LSNs do not compare) or from
    none."""
    rows = conn.execute(
        "SELECT s.slot_name, CASE WHEN c.complete THEN c.commit_lsn ELSE c.commit_lsn - 1 END, "
        " greatest("
        "  (SELECT r.commit_lsn FROM lakefold.changelog r WHERE r.stream_id = s.stream_id"
        "   AND r.position <= s.head ORDER BY r.position DESC LIMIT 1),"
        "  (SELECT g.commit_lsn FROM lakefold.changelog_segments g"
        "   WHERE g.stream_id = s.stream_id AND g.first_position <= s.head"
        "   ORDER BY g.first_position DESC LIMIT 1)) "
        "FROM lakefold.changelog_streams s JOIN lakefold.capture_slots c USING (slot_name) "
        "WHERE s.name = ANY(%s)", (list(streams),)).fetchall()
    if len({row[0] for row in rows}) != 1:
        return None
    return max(int(lsn) for row in rows for lsn in row[1:] if lsn is not None)


def first_after(conn: psycopg.Connection[Any], stream: str, start: int, end: int,
                lsn: int) -> int | None:
    """The first position of ``[start, end)`` in ``stream`` whose record was committed after
    ``lsn`` (rows and snapshot segments alike); None when there is none."""
    row = conn.execute(
        "WITH s AS (SELECT stream_id FROM lakefold.changelog_streams WHERE name = %(stream)s) "
        "SELECT least("
        " (SELECT min(c.position) FROM lakefold.changelog c, s WHERE c.stream_id = s.stream_id"
        "  AND c.position >= %(start)s AND c.position < %(end)s AND c.commit_lsn > %(lsn)s),"
        " (SELECT min(greatest(g.first_position, %(start)s)) FROM lakefold.changelog_segments g,"
        "  s WHERE g.stream_id = s.stream_id AND g.last_position >= %(start)s"
        "  AND g.first_position < %(end)s AND g.commit_lsn > %(lsn)s))",
        {"stream": stream, "start": start, "end": end, "lsn": lsn}).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def commit_at(conn: psycopg.Connection[Any], stream: str, position: int) -> int | None:
    """The commit LSN of the first record of ``stream`` at or after ``position`` (a row or a
    snapshot segment); None when there is none."""
    row = conn.execute(
        "WITH s AS (SELECT stream_id FROM lakefold.changelog_streams WHERE name = %(stream)s) "
        "SELECT (SELECT ARRAY[c.position, c.commit_lsn] FROM lakefold.changelog c, s "
        "  WHERE c.stream_id = s.stream_id AND c.position >= %(p)s ORDER BY c.position LIMIT 1),"
        " (SELECT ARRAY[greatest(g.first_position, %(p)s), g.commit_lsn] "
        "  FROM lakefold.changelog_segments g, s WHERE g.stream_id = s.stream_id "
        "  AND g.last_position >= %(p)s ORDER BY g.first_position LIMIT 1)",
        {"stream": stream, "p": position}).fetchone()
    found = [r for r in (row or ()) if r is not None]
    return None if not found else int(min(found)[1])
