"""One commit cut per micro-batch across the changelog sources of a fold.

Spark plans a micro-batch by asking each source, one after the other, where its batch ends.
Each changelog source reading up to its own head would cut the source's transactions wherever
the capture was when it was asked: a transaction that moved a customer and placed an order
could reach the customers' batch and only the next batch of the orders, and the fold would
apply the order first. So the changelog sources of one fold query share, per planning round,
one commit LSN (``frontier``: every transaction up to it is in the store), and each ends its
batch before its first record committed after it (``first_after``): a micro-batch holds all of
a source transaction or none of it.

The round is each source's count of plannings: Spark asks every source once per round, in the
same loop, so the n-th question to each belongs to one round. The first source asked in a
round stores the round's LSN (``lakefold.commit_cuts``, keyed by the query start's group id and
the round); the others read it. A restarted query is a new group. Streams of several slots
share no LSN order and get no cut.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from lakefold.capture.store import first_after, frontier

_DDL = """
CREATE TABLE IF NOT EXISTS lakefold.commit_cuts (
    cut_group text NOT NULL,
    round bigint NOT NULL,
    lsn bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cut_group, round)
)"""
#: Rounds of a group kept behind the newest (a straggler of an older round still finds it).
_KEEP_ROUNDS = 16


@dataclass(frozen=True)
class CutGroup:
    """The changelog streams of one fold query that share their cuts; ``name`` is unique to
    the query's start."""

    name: str
    streams: tuple[str, ...]

    @classmethod
    def new(cls, projection: str, streams: tuple[str, ...]) -> CutGroup:
        return cls(f"{projection}:{uuid.uuid4().hex}", streams)

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "streams": list(self.streams)})

    @classmethod
    def from_json(cls, text: str) -> CutGroup:
        data = json.loads(text)
        return cls(str(data["name"]), tuple(data["streams"]))


def install(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE SCHEMA IF NOT EXISTS lakefold")
    conn.execute(_DDL)


def round_lsn(conn: psycopg.Connection[Any], group: CutGroup, round_: int) -> int | None:
    """The round's shared LSN: stored by the first source asked, read by the others."""
    lsn = frontier(conn, group.streams)
    with conn.transaction():
        conn.execute("INSERT INTO lakefold.commit_cuts (cut_group, round, lsn) "
                     "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", (group.name, round_, lsn))
        row = conn.execute("SELECT lsn FROM lakefold.commit_cuts WHERE cut_group = %s "
                           "AND round = %s", (group.name, round_)).fetchone()
        conn.execute("DELETE FROM lakefold.commit_cuts WHERE (cut_group = %s AND round < %s) "
                     "OR created_at < now() - interval '1 day'",
                     (group.name, round_ - _KEEP_ROUNDS))
    return None if row is None or row[0] is None else int(row[0])


def cut_end(dsn: str, group: CutGroup, stream: str, round_: int, start: int, end: int) -> int:
    """``end`` lowered to the first position of ``[start, end)`` committed after the round's
    LSN (see the module docstring)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            lsn = round_lsn(conn, group, round_)
        except psycopg.errors.UndefinedTable:
            install(conn)
            lsn = round_lsn(conn, group, round_)
        if lsn is None or end <= start:
            return end
        first = first_after(conn, stream, start, end, lsn)
    return end if first is None else max(start, first)
