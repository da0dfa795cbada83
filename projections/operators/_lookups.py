"""Enriching events with a captured table's row as of the event's place in commit order.

::

    view("orders_enriched", inputs={"orders": events("order", types=[OrderPlaced])},
         enrich={"orders": lookup("shop.customers", on="customer_id",
                                  columns={"city": "customer_city"})}, ...)

A *stream-table join* that replays to the same answer. Each event of the input gets the
columns of the table's row whose key equals the event's ``on`` columns (in the order of the
table's primary key), as that row was when the event's transaction committed: the version
with the largest commit LSN at or below the event's own commit LSN (changes made in the same
transaction included). Nothing is found (NULL columns) when the key had no row then, or a
key column of the event is NULL.

How it is exact and stable. The event store writes a commit marker with every append
(``eventstore._commit_markers``), which the capture of the same database stores with its
commit LSN; the table's history (``capture.store._table_history``) keeps every version by
commit LSN. The feed of the event input (``_view_events``) enriches an event once, when it
feeds it, so the enriched columns are part of the event's row: a late correction, a replay
of a late event, a view downstream and a ``lakefold rebuild`` all see the same values, however
the table changed since. The feed only feeds events whose enrichment is final: those whose
markers the capture has stored (with them, every table version committed before). Events
recorded before the markers were installed (the first such view installs them) never get one;
the feed tells them apart by marking a WAL position after them and feeding them, as of the
history's start, once the capture has stored that position (a batch or more later).

It needs the events in the captured database (one WAL, one commit order): a view whose events
are elsewhere is refused, with ``as_of="latest"`` as the way out.

``as_of="latest"`` enriches an event with the row as the history holds it when the event is
fed: like Flink's processing-time lookup join, cheap and immediate, and **not** replay-stable
(a rebuild enriches with the rows as they are then). A view that should follow the table's
changes instead reads the table as an input and joins it in its query: that is a maintained
relational join, equal at every batch to the query over the current rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from lakefold.eventstore.internals import (
    database_identity,
    install_commit_markers,
    transaction_ranges,
)
from lakefold.projections.definitions._view_inputs import Lookup
from lakefold.projections.exceptions import ProjectionDefinitionError, UnknownSourceError
from lakefold.projections.state._table_history import TableHistory
from lakefold.store.exceptions import StoreError
from lakefold.store.internals import (
    DERIVED_SLOT,
    StreamSchema,
    arrow_type,
    encode_key,
    event_commit_lsns,
    slot_flushed,
)

#: A lookup at this LSN reads the latest row the history holds.
LATEST_LSN: Final = 2**62
#: Table key kinds a lookup matches, with the event column types that can equal them.
_KEY_KINDS: Final[dict[str, tuple[str, ...]]] = {
    "int2": ("integer",), "int4": ("integer",), "int8": ("integer",),
    "text": ("string",), "enum": ("string",), "uuid": ("string",), "other": ("string",),
    "date": ("date",),
}


def _kind_class(data_type: pa.DataType) -> str:
    if pa.types.is_integer(data_type):
        return "integer"
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "string"
    if pa.types.is_date32(data_type):
        return "date"
    return str(data_type)


def lookup_fields(view: str, alias: str, found: Lookup, events: pa.Schema,
                  table: StreamSchema) -> list[pa.Field]:
    """The columns ``found`` adds to input ``alias``'s rows; refuses a lookup that does not
    fit the event columns or the table, saying what to change."""
    where = f"view {view}: input {alias}: lookup({found.table!r})"
    keys = [c for c in table.columns if c.key]
    if not keys:
        raise ProjectionDefinitionError(
            f"{where}: the table has no primary key (or replica identity index) to look rows "
            "up by")
    if len(keys) != len(found.on):
        raise ProjectionDefinitionError(
            f"{where}: on= names {len(found.on)} column(s) ({', '.join(found.on)}), but the "
            f"table's key has {len(keys)} ({', '.join(c.name for c in keys)}); name one event "
            "column per key column, in that order")
    for name, key in zip(found.on, keys, strict=True):
        if name not in events.names:
            raise ProjectionDefinitionError(
                f"{where}: the events have no column {name!r}; their columns are "
                f"{', '.join(events.names)}")
        wanted = _KEY_KINDS.get(key.kind)
        have = _kind_class(events.field(name).type)
        if wanted is None:
            raise ProjectionDefinitionError(
                f"{where}: the table's key column {key.name} is of type {key.type_name}, "
                "which lookups do not match; key columns of integer, text, uuid or date "
                "types are")
        if have not in wanted:
            raise ProjectionDefinitionError(
                f"{where}: event column {name} is {events.field(name).type}, but the "
                f"table's key column {key.name} is {key.type_name}; give an event column "
                f"holding the same values (a {wanted[0]})")
    by_name = {c.name: c for c in table.columns}
    pairs = found.columns or tuple((c.name, c.name) for c in table.columns if not c.key)
    fields = []
    for source, out in pairs:
        column = by_name.get(source)
        if column is None:
            raise ProjectionDefinitionError(
                f"{where}: the table has no column {source!r}; its columns are "
                f"{', '.join(by_name)}")
        if out in events.names:
            raise ProjectionDefinitionError(
                f"{where}: output column {out!r} is already a column of the events; map it "
                f"to another name (columns={{{source!r}: '<name>'}})")
        fields.append(pa.field(out, arrow_type(column)))
    return fields


def _key_texts(values: pa.ChunkedArray | pa.Array) -> list[str | None]:
    """Event key values as the text PostgreSQL prints for the table's key."""
    if pa.types.is_date32(values.type):
        return [None if v is None else v.isoformat() for v in values.to_pylist()]
    return pc.cast(values, pa.string()).to_pylist()  # type: ignore[no-any-return]


class Enricher:
    """The lookups of one event input, run when its feed feeds events (see the module
    docstring): ``enrich`` adds their columns to a table of event rows."""

    def __init__(self, view: str, alias: str, lookups: Sequence[Lookup],
                 fields: Sequence[Sequence[pa.Field]]) -> None:
        self.view = view
        self.alias = alias
        self.lookups = tuple(lookups)
        self.fields = [list(f) for f in fields]
        self.histories = {lk.table: TableHistory(lk.table) for lk in lookups}
        #: Slot of each looked-up table's stream (filled by ``create``).
        self.slots: dict[str, str] = {}
        #: Whether appends write commit markers (``ensure_markers``).
        self._markers = False

    @property
    def by_commit(self) -> bool:
        """True when some lookup is as of the events' commits (the feed waits for them)."""
        return any(lk.as_of == "commit" for lk in self.lookups)

    def create(self, conn: psycopg.Connection[Any]) -> None:
        """Create the tables' histories; with a lookup as of commit, check that the events
        are in the captured database and install commit markers."""
        for table, history in self.histories.items():
            history.create(conn)
            row = conn.execute("SELECT slot_name FROM lakefold.changelog_streams "
                               "WHERE name = %s", (table,)).fetchone()
            assert row is not None  # noqa: S101 - the plan checked the stream exists
            self.slots[table] = str(row[0])
        if not self.by_commit:
            return
        here = database_identity(conn)
        for lk in self.lookups:
            if lk.as_of != "commit":
                continue
            slot = slot_flushed(conn, self.slots[lk.table])
            if slot is None or (slot[1], slot[2]) != here:
                source = "no capture slot" if slot is None else \
                    f"database {slot[2]} (system {slot[1]})"
                raise ProjectionDefinitionError(
                    f"view {self.view}: input {self.alias}: lookup({lk.table!r}) as of commit "
                    f"needs the events and the table in one database (one commit order), but "
                    f"the table is captured from {source} and the events are in database "
                    f"{here[1]} (system {here[0]}); keep the event store in the captured "
                    "database, or use as_of='latest' (not replay-stable)")
        self.ensure_markers(conn)

    def ensure_markers(self, conn: psycopg.Connection[Any]) -> None:
        """Install the commit markers once the event store exists (checked until then)."""
        if not self._markers:
            self._markers = install_commit_markers(conn)

    def flushed(self, conn: psycopg.Connection[Any]) -> int:
        """The WAL position below which every commit of the source is stored by the
        captures of the tables looked up as of commit."""
        found = [slot_flushed(conn, slot) for slot in self._commit_slots()]
        return min((f[0] for f in found if f is not None), default=0)

    def _commit_slots(self) -> list[str]:
        return sorted({self.slots[lk.table] for lk in self.lookups if lk.as_of == "commit"})

    def commit_order(self, conn: psycopg.Connection[Any], start: int, end: int) -> CommitOrder:
        """The transactions of positions ``[start, end)`` with their commit LSNs where every
        capture looked up as of commit has stored their markers (-1 elsewhere)."""
        runs = transaction_ranges(conn, start, end)
        firsts = np.array([r[0] for r in runs], dtype=np.int64)
        ends = firsts + np.array([r[1] for r in runs], dtype=np.int64)
        xids = [r[2] for r in runs]
        lsns = np.full(len(runs), -1, dtype=np.int64)
        found = [event_commit_lsns(conn, slot, xids) for slot in self._commit_slots()]
        for i, xid in enumerate(xids):
            if found and all(xid in f for f in found):
                lsns[i] = found[0][xid]
        return CommitOrder(firsts, ends, lsns)

    def enrich(self, conn: psycopg.Connection[Any], rows: pa.Table,
               order: CommitOrder | None) -> pa.Table:
        """``rows`` (event rows with ``position``) with every lookup's columns appended;
        ``order`` gives the events' commit LSNs (an unknown one counts as recorded before the
        markers: 0)."""
        positions = rows.column("position").to_numpy()
        at_commit = order.lsns_of(positions) if order is not None else \
            np.zeros(len(positions), dtype=np.int64)
        for index, lk in enumerate(self.lookups):
            history = self.histories[lk.table]
            history.advance(conn)
            at = at_commit if lk.as_of == "commit" else \
                np.full(rows.num_rows, LATEST_LSN, dtype=np.int64)
            texts = [_key_texts(rows.column(c)) for c in lk.on]
            keys = [None if any(v is None for v in values) else encode_key(values)
                    for values in zip(*texts, strict=True)]
            found = history.as_of(conn, keys, at.tolist())
            take = np.full(rows.num_rows, -1, dtype=np.int64)
            take[found.column("_ordinal").to_numpy()] = np.arange(found.num_rows)
            indices = pa.array(take, mask=take < 0)
            pairs = lk.columns or tuple((f.name, f.name) for f in self.fields[index])
            for (source, _), field in zip(pairs, self.fields[index], strict=True):
                rows = rows.append_column(field, found.column(source).take(indices)
                                          .cast(field.type))
        return rows


@dataclass(frozen=True)
class CommitOrder:
    """Transactions of the event store (runs of positions ``[firsts[i], ends[i])``) and
    their commit LSNs (-1: no marker stored)."""

    firsts: np.ndarray
    ends: np.ndarray
    lsns: np.ndarray

    def first_unknown(self) -> int | None:
        """The first position whose commit LSN is not known (None: all known)."""
        unknown = np.flatnonzero(self.lsns < 0)
        return int(self.firsts[unknown[0]]) if len(unknown) else None

    def settle(self, through: int) -> CommitOrder:
        """Unknown LSNs of positions up to ``through`` (exclusive) set to 0: their
        transactions committed before a WAL position the captures have stored, without a
        marker (recorded before the markers were installed)."""
        lsns = self.lsns.copy()
        lsns[(lsns < 0) & (self.firsts < through)] = 0
        return CommitOrder(self.firsts, self.ends, lsns)

    def lsns_of(self, positions: np.ndarray) -> np.ndarray:
        """Each position's commit LSN (0 where unknown)."""
        if not len(self.firsts):
            return np.zeros(len(positions), dtype=np.int64)
        which = np.searchsorted(self.firsts, positions, side="right") - 1
        found: np.ndarray = np.maximum(self.lsns[np.maximum(which, 0)], 0)
        return found


def enrichment_fields(store_dsn: str, view: str, alias: str, lookups: Sequence[Lookup],
                      events: pa.Schema) -> list[list[pa.Field]]:
    """The columns each lookup adds (see ``lookup_fields``), read off the tables' streams."""
    from lakefold.store import ChangelogStore

    out: list[list[pa.Field]] = []
    schema = events
    with ChangelogStore(store_dsn) as store:
        for lk in lookups:
            try:
                info = store.stream(lk.table)
                table = store.stream_schema(lk.table)
            except StoreError as e:
                raise UnknownSourceError(
                    f"view {view}: input {alias}: lookup({lk.table!r}): {e}") from e
            if info.slot == DERIVED_SLOT:
                raise ProjectionDefinitionError(
                    f"view {view}: input {alias}: lookup({lk.table!r}) reads a view's output; "
                    "lookups read captured tables (the capture keeps their history)")
            fields = lookup_fields(view, alias, lk, schema, table)
            for field in fields:
                schema = schema.append(field)
            out.append(fields)
    return out
