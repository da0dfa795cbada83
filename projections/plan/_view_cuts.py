"""Where a view's batch cuts its inputs, so that a chain of views shows only states that existed.

A view joining captured tables cuts them all at their heads, read in one statement: the capture
moves the heads of a source transaction's streams in one store transaction, so the cut is the
source as of one commit. A view that also reads another view's output (a chain) cannot cut that
output at its head and the tables at theirs: the upstream view lags its own inputs by a batch,
so its head shows an older source commit than the tables' heads, and the downstream view would
join a new customer with the orders of before (a state the source never had).

So every batch of a view records its *cut*: the source commit its output reflects (a commit
LSN of the capture slot its tables come from, the *frontier*), at which output position, and
until which commit that output stays exact (``lakefold.view_cuts``). A downstream view
chooses one frontier ``F`` that every upstream view's output represents exactly and the tables'
heads have reached, cuts each upstream output at the position that reflects ``F`` and each
table at its last record committed at or before ``F`` (``capture.store._commit_points``). Its
own output then reflects ``F``: every version a target writes is the source at one commit.

One row per output position of a view generation's stream: ``frontier`` (the frontier of the
batch that wrote it), ``valid_until`` (the first commit applied by the next batch that changed
the output: the output at this position is the source's view for every frontier in
``[frontier, valid_until)``), and, on the latest row, ``reflects``: the newest frontier the
view has applied without its output changing. Views whose inputs come from no capture slot or
from several (event inputs, two databases) have no frontier: there is no commit order to align
on, and such a chain gives what its inputs' heads give (docs/views.md, inputs from several
sources).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import psycopg

from lakefold.core import migrations
from lakefold.core.migrations import Migration
from lakefold.store.internals import first_after, frontier

_DDL: Final = [
    """CREATE TABLE IF NOT EXISTS lakefold.view_cuts (
        stream text NOT NULL,
        position bigint NOT NULL,
        slot text NOT NULL,
        frontier bigint NOT NULL,
        reflects bigint NOT NULL,
        valid_until bigint,
        PRIMARY KEY (stream, position))""",
]
COMPONENT: Final = migrations.register(
    "view_cuts", Migration(1, "where view batches cut their inputs", *_DDL))


def install_view_cuts(conn: psycopg.Connection[Any]) -> None:
    """Create the cuts table (idempotent, concurrency-safe)."""
    migrations.migrate(conn, COMPONENT)


@dataclass(frozen=True)
class Cut:
    """Where a batch reads each input up to (stream → last position), and the frontier its
    output will reflect (None: the inputs have no common slot; heads as they are)."""

    heads: dict[str, int]
    slot: str | None = None
    frontier: int | None = None


def _slots(conn: psycopg.Connection[Any], streams: list[str]) -> dict[str, str]:
    return dict(conn.execute(
        "SELECT name, slot_name FROM lakefold.changelog_streams WHERE name = ANY(%s)",
        (streams,)).fetchall())


@dataclass(frozen=True)
class _Row:
    """One recorded cut of an upstream view's output (see the module docstring)."""

    position: int
    slot: str
    frontier: int
    reflects: int
    valid_until: int | None


def choose_cut(conn: psycopg.Connection[Any], tables: Mapping[str, int],
               views: Mapping[str, int], own: str, starts: Mapping[str, int]) -> Cut | None:
    """The cut of a batch over captured ``tables`` and upstream ``views``' output streams
    (stream → its head, read in one statement), for the view whose output stream is ``own``
    and whose inputs' next positions are ``starts``; None when no cut can move the view
    forward consistently yet (an upstream view has not reached the frontier the view is at)."""
    heads = dict(tables) | dict(views)
    slots = set(_slots(conn, list(tables)).values())
    if len(slots) > 1:
        return Cut(heads)  # tables of two sources: no common commit order
    slot = next(iter(slots), None)
    top = frontier(conn, list(tables)) if tables else None
    upstream = {stream: rows for stream, rows in _upstream_rows(conn, list(views)).items()
                if slot is None or rows[-1].slot == slot}
    if not upstream:
        return Cut(heads, slot, top)
    if len({rows[-1].slot for rows in upstream.values()}) > 1:
        return Cut(heads)  # upstream views over two sources
    slot = slot or next(iter(upstream.values()))[-1].slot
    wanted = min([rows[-1].reflects for rows in upstream.values()] +
                 ([top] if top is not None else []))
    chosen: dict[str, _Row] = {}
    while True:  # down to a frontier every upstream output represents exactly
        for stream, rows in upstream.items():
            row = _exact_at(rows, wanted)
            if row is None:
                return None  # before its first batch: wait for it
            chosen[stream] = row
        gaps = [r.valid_until - 1 for r in chosen.values()
                if r.valid_until is not None and wanted >= r.valid_until]
        if not gaps:
            break
        wanted = min(gaps)
    previous = _own_frontier(conn, own)
    if previous is not None and wanted < previous:
        return None  # the upstream views are behind what this view reflects
    for stream, row in chosen.items():
        heads[stream] = row.position
    if top is not None and wanted < top:
        for stream, head in tables.items():
            after = first_after(conn, stream, starts.get(stream, 1), head + 1, wanted)
            if after is not None:
                heads[stream] = after - 1
    return Cut(heads, slot, wanted)


def _upstream_rows(conn: psycopg.Connection[Any], streams: list[str]
                   ) -> dict[str, list[_Row]]:
    """Each upstream stream's cut rows in position order (streams that record cuts)."""
    if not streams:
        return {}
    found: dict[str, list[_Row]] = {}
    for stream, position, slot, at, reflects, until in conn.execute(
            "SELECT stream, position, slot, frontier, reflects, valid_until "
            "FROM lakefold.view_cuts WHERE stream = ANY(%s) ORDER BY stream, position",
            (streams,)).fetchall():
        found.setdefault(stream, []).append(_Row(
            int(position), str(slot), int(at), int(reflects),
            None if until is None else int(until)))
    return found


def _exact_at(rows: list[_Row], at: int) -> _Row | None:
    """The last row written at or before frontier ``at`` (None: ``at`` is before its first
    batch); its ``valid_until`` says whether its output still holds at ``at``."""
    found = None
    for row in rows:
        if row.frontier <= at:
            found = row
    return found


def _own_frontier(conn: psycopg.Connection[Any], own: str) -> int | None:
    row = conn.execute("SELECT max(reflects) FROM lakefold.view_cuts WHERE stream = %s",
                       (own,)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def record_cut(conn: psycopg.Connection[Any], own: str, cut: Cut, head: int, *,
               moved: bool, first_commit: int | None) -> None:
    """Record, in the batch's transaction, that the output of stream ``own`` at ``head``
    reflects ``cut``'s frontier: a new row when the batch changed the output (the previous
    row is exact until ``first_commit``, the first commit the batch applied), else the latest
    row reflects the newer frontier."""
    if cut.frontier is None or cut.slot is None:
        return
    if moved:
        conn.execute(
            "UPDATE lakefold.view_cuts SET valid_until = %s WHERE stream = %s AND "
            "valid_until IS NULL AND position < %s",
            (first_commit if first_commit is not None else cut.frontier, own, head))
        conn.execute(
            "INSERT INTO lakefold.view_cuts (stream, position, slot, frontier, reflects) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (stream, position) DO UPDATE SET "
            "frontier = EXCLUDED.frontier, reflects = EXCLUDED.reflects, valid_until = NULL",
            (own, head, cut.slot, cut.frontier, cut.frontier))
        _prune(conn, own)
        return
    updated = conn.execute(
        "UPDATE lakefold.view_cuts SET reflects = greatest(reflects, %s) WHERE stream = %s "
        "AND valid_until IS NULL", (cut.frontier, own)).rowcount
    if not updated:  # the first batch wrote nothing: an empty output reflects it
        conn.execute(
            "INSERT INTO lakefold.view_cuts (stream, position, slot, frontier, reflects) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (own, head, cut.slot, cut.frontier, cut.frontier))


def _prune(conn: psycopg.Connection[Any], own: str) -> None:
    """Delete the rows no reader of ``own`` can cut at again: a reader (a downstream view,
    a target) has applied the stream up to a position, so it never cuts before the last row
    at or below it (its frontier only grows)."""
    conn.execute(
        "DELETE FROM lakefold.view_cuts c WHERE c.stream = %(own)s AND c.position < ("
        " SELECT max(k.position) FROM lakefold.view_cuts k WHERE k.stream = %(own)s AND"
        " k.position <= coalesce((SELECT min(r.position) FROM lakefold.changelog_readers r"
        "  JOIN lakefold.changelog_streams s USING (stream_id) WHERE s.name = %(own)s),"
        "  k.position))", {"own": own})


def forget_cuts(conn: psycopg.Connection[Any], own: str) -> None:
    """Delete a retired generation's cut rows."""
    conn.execute("DELETE FROM lakefold.view_cuts WHERE stream = %s", (own,))
