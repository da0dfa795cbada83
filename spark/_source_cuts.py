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

**The record limit** (``maxRecordsPerTrigger``) is applied through the LSN too, never by
ending one source's batch at a position: that would leave the rest of a transaction, or older
transactions of that stream, for a later batch than the other streams' newer records. Each
source notes where its batch starts (``lakefold.commit_cut_starts``, by the group's owner: the
fold and generation, so a restart knows them); the round's LSN is lowered so that each noted
stream holds at most the limit's worth of records after its start, ending before the
transaction that would pass it (a start noted in an earlier round is at or before the real
one, so the batch is only smaller). Only when one transaction (or one snapshot) alone passes
the limit does a batch end inside it, at the limit, and only in the stream where the round's
LSN is that very transaction: every other record of the batch committed before or with it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from lakefold.core import migrations
from lakefold.core.migrations import Migration
from lakefold.spark._source_positions import capped_end
from lakefold.store import commit_at, first_after, frontier

_DDL = """
CREATE TABLE IF NOT EXISTS lakefold.commit_cuts (
    cut_group text NOT NULL,
    round bigint NOT NULL,
    lsn bigint,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cut_group, round)
);
CREATE TABLE IF NOT EXISTS lakefold.commit_cut_starts (
    owner text NOT NULL,
    stream text NOT NULL,
    start bigint NOT NULL,
    PRIMARY KEY (owner, stream)
)"""
COMPONENT = migrations.register(
    "commit_cuts", Migration(1, "commit cuts of fold queries", _DDL))
#: Rounds of a group kept behind the newest (a straggler of an older round still finds it).
_KEEP_ROUNDS = 16


@dataclass(frozen=True)
class CutGroup:
    """The changelog streams of one fold query that share their cuts; ``name`` is unique to
    the query's start."""

    name: str
    streams: tuple[str, ...]

    @classmethod
    def new(cls, owner: str, streams: tuple[str, ...]) -> CutGroup:
        """A group for a new query of ``owner`` (the fold and its generation)."""
        return cls(f"{owner}:{uuid.uuid4().hex}", streams)

    @property
    def owner(self) -> str:
        return self.name.rsplit(":", 1)[0]

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "streams": list(self.streams)})

    @classmethod
    def from_json(cls, text: str) -> CutGroup:
        data = json.loads(text)
        return cls(str(data["name"]), tuple(data["streams"]))


def install(conn: psycopg.Connection[Any]) -> None:
    """Create the cut tables if missing (migrates component ``commit_cuts``)."""
    migrations.migrate(conn, COMPONENT)


def _limit_lsn(conn: psycopg.Connection[Any], stream: str, start: int, limit: int
               ) -> int | None:
    """The newest LSN up to which ``stream`` holds at most ``limit`` records after ``start``
    (the commit before the transaction that passes the limit; that transaction's own LSN when
    it starts the range); None when fewer records follow."""
    first = commit_at(conn, stream, start)
    passing = commit_at(conn, stream, start + limit)
    if first is None or passing is None:
        return None
    return passing - 1 if passing > first else first


def round_lsn(conn: psycopg.Connection[Any], group: CutGroup, round_: int,
              limit: int | None = None) -> int | None:
    """The round's shared LSN: stored by the first source asked, read by the others."""
    stored = conn.execute("SELECT lsn FROM lakefold.commit_cuts WHERE cut_group = %s "
                          "AND round = %s", (group.name, round_)).fetchone()
    if stored is not None:  # a later source of the round: no need to work it out again
        return None if stored[0] is None else int(stored[0])
    lsn = frontier(conn, group.streams)
    if lsn is not None and limit is not None:
        for stream, start in conn.execute(
                "SELECT stream, start FROM lakefold.commit_cut_starts WHERE owner = %s "
                "AND stream = ANY(%s)", (group.owner, list(group.streams))).fetchall():
            bound = _limit_lsn(conn, stream, int(start), limit)
            lsn = lsn if bound is None else min(lsn, bound)
    with conn.transaction():
        conn.execute("INSERT INTO lakefold.commit_cuts (cut_group, round, lsn) "
                     "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", (group.name, round_, lsn))
        row = conn.execute("SELECT lsn FROM lakefold.commit_cuts WHERE cut_group = %s "
                           "AND round = %s", (group.name, round_)).fetchone()
        conn.execute("DELETE FROM lakefold.commit_cuts WHERE (cut_group = %s AND round < %s) "
                     "OR created_at < now() - interval '1 day'",
                     (group.name, round_ - _KEEP_ROUNDS))
    return None if row is None or row[0] is None else int(row[0])


def _note_start(conn: psycopg.Connection[Any], group: CutGroup, stream: str,
                start: int) -> None:
    conn.execute("INSERT INTO lakefold.commit_cut_starts (owner, stream, start) "
                 "VALUES (%s, %s, %s) ON CONFLICT (owner, stream) DO UPDATE "
                 "SET start = excluded.start", (group.owner, stream, start))


def cut_end(dsn: str, group: CutGroup, stream: str, round_: int, start: int, end: int,
            limit: int | None = None) -> int:
    """``end`` (the head's end) lowered to the first position of ``[start, end)`` committed
    after the round's LSN, which keeps every stream of the group within ``limit`` records
    (see the module docstring)."""
    first_record = max(start, 1)  # position 0 holds no record
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            _note_start(conn, group, stream, first_record)
        except psycopg.errors.UndefinedTable:
            install(conn)
            _note_start(conn, group, stream, first_record)
        lsn = round_lsn(conn, group, round_, limit)
        if end <= start:
            return end
        if lsn is None:  # no shared order: the limit by position
            return capped_end(start, end - 1, limit)
        first = first_after(conn, stream, start, end, lsn)
        cut = end if first is None else max(start, first)
        if limit is not None and cut > first_record + limit and \
                commit_at(conn, stream, first_record + limit) == lsn:
            cut = first_record + limit  # one transaction alone passes the limit
    return cut
