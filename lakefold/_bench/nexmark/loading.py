"""The generated events, put where each engine reads them: lakefold's event store (registered
pydantic models, appended in log order) and Parquet files for the oracle and the peers."""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel

from lakefold._bench.nexmark.generator import AUCTION, BID, PERSON
from lakefold._bench.nexmark.queries import AUCTION_TYPE, BID_TYPE, CATEGORY, PERSON_TYPE
from lakefold._bench.report import BenchmarkError
from lakefold.schemas import EventRegistry

registry = EventRegistry()


@registry.event(PERSON_TYPE)
class Person(BaseModel):
    """A new person (Nexmark's ``Person``)."""

    id: int
    name: str
    emailAddress: str
    creditCard: str
    city: str
    state: str
    dateTime: datetime
    extra: str


@registry.event(AUCTION_TYPE)
class Auction(BaseModel):
    """A new auction (Nexmark's ``Auction``; its ``category`` is ``categoryId``: a payload
    field may not be named like the event column ``category``)."""

    id: int
    itemName: str
    description: str
    initialBid: int
    reserve: int
    dateTime: datetime
    expires: datetime
    seller: int
    categoryId: int
    extra: str


@registry.event(BID_TYPE)
class Bid(BaseModel):
    """A bid (Nexmark's ``Bid``)."""

    auction: int
    bidder: int
    price: int
    channel: str
    url: str
    dateTime: datetime
    extra: str


#: Each kind's payload fields: event type, then (payload field, column of the flat table).
_PAYLOADS: dict[int, tuple[str, list[tuple[str, str]]]] = {
    PERSON: (PERSON_TYPE, [("id", "p_id"), ("name", "p_name"),
                           ("emailAddress", "p_emailAddress"), ("creditCard", "p_creditCard"),
                           ("city", "p_city"), ("state", "p_state"), ("dateTime", "dateTime"),
                           ("extra", "p_extra")]),
    AUCTION: (AUCTION_TYPE, [("id", "a_id"), ("itemName", "a_itemName"),
                             ("description", "a_description"), ("initialBid", "a_initialBid"),
                             ("reserve", "a_reserve"), ("dateTime", "dateTime"),
                             ("expires", "a_expires"), ("seller", "a_seller"),
                             ("categoryId", "a_category"), ("extra", "a_extra")]),
    BID: (BID_TYPE, [("auction", "b_auction"), ("bidder", "b_bidder"), ("price", "b_price"),
                     ("channel", "b_channel"), ("url", "b_url"), ("dateTime", "dateTime"),
                     ("extra", "b_extra")]),
}
#: Events per append (one stream each, so the log keeps the generated order).
APPEND = 10_000


def _iso(column: pa.ChunkedArray | pa.Array) -> list[Any]:
    """Timestamps as ISO 8601 text (``2026-11-28T00:00:01.234+00:00``)."""
    text = pc.strftime(column, format="%Y-%m-%dT%H:%M:%S")  # %S has the milliseconds
    return [None if t is None else t + "+00:00" for t in text.to_pylist()]


def _payloads(chunk: pa.Table) -> list[Any]:
    """(event type, payload dict) of each event of ``chunk``, in order."""
    from lakefold.schemas import NewEvent

    kinds = chunk.column("event_type").to_pylist()
    columns: dict[str, list[Any]] = {}
    for name in chunk.column_names:
        if name in ("position", "event_type"):
            continue
        column = chunk.column(name)
        columns[name] = _iso(column) if pa.types.is_timestamp(column.type) \
            else column.to_pylist()
    out = []
    for row, kind in enumerate(kinds):
        type_name, fields = _PAYLOADS[kind]
        out.append(NewEvent(type_name, {f: columns[c][row] for f, c in fields}))
    return out


def append_events(dsn: str, events: pa.Table) -> float:
    """Append ``events`` to the event store at ``dsn`` in their order (positions 1..n, each
    ``APPEND`` events one stream of category ``CATEGORY``); returns events/s."""
    from lakefold.eventstore import NO_STREAM, EventStore, StreamEvents

    began = time.perf_counter()
    with EventStore(dsn) as store:
        store.install()
        for number, start in enumerate(range(0, events.num_rows, APPEND)):
            chunk = events.slice(start, APPEND)
            store.append_streams([StreamEvents(f"{CATEGORY}-{number}", _payloads(chunk),
                                               NO_STREAM)])
        if store.head() != events.num_rows:
            raise BenchmarkError(f"the store holds {store.head()} events, not "
                                 f"{events.num_rows}")
    return float(events.num_rows / (time.perf_counter() - began))


def write_parquet(events: pa.Table, folder: Path, per_file: int) -> None:
    """The events as Parquet files of ``per_file`` events in ``folder``, named and with
    modification times in log order (Spark's file source reads the oldest first)."""
    folder.mkdir(parents=True)
    files = -(-events.num_rows // per_file)
    first = int(time.time()) - files - 10
    for n, start in enumerate(range(0, events.num_rows, per_file)):
        path = folder / f"part-{n:06d}.parquet"
        pq.write_table(events.slice(start, per_file), path)
        os.utime(path, (first + n, first + n))
