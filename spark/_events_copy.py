"""A bulk reader of the event store's global log for Spark tasks: COPY ... TO STDOUT (CSV),
parsed by Arrow's multi-threaded CSV reader, no per-row Python.

``copy_events_range`` returns what ``lakefold.eventstore.read_events_range`` returns (same
rows, same ``EVENTS_ARROW_SCHEMA``, same filters and semantics: positions ``[start, end)``,
only sequenced positions, soft-deleted events hidden, deletion records passing a type filter),
several times faster, because the store's per-row Python conversion is the bottleneck of a
Spark read. It runs the store's own SELECT (``log_statement``), so it follows the store's
tables; a test compares the two readers row for row.
"""

from __future__ import annotations

import importlib
import io
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from psycopg import sql

from lakefold.dsn import mask_dsn
from lakefold.eventstore import EVENTS_ARROW_SCHEMA, read_events_range
from lakefold.schemas.events import STREAM_DELETED_TYPE
from lakefold.spark.exceptions import SourceUnavailable, SparkLayerError


# The store's own read of the global log (its columns and WHERE clause), so that this reader
# follows the store's tables; wrapped in a COPY that names the columns and turns the timestamp
# into epoch microseconds for the CSV parser. If the store's internals move, the import fails
# and reads fall back to its public row reader, slower but right.
def _store_sql() -> tuple[sql.Composable, Callable[..., sql.Composed]] | None:
    try:
        arrow = importlib.import_module("lakefold.eventstore._arrow")
        reads = importlib.import_module("lakefold.eventstore._reads")
        return arrow._COLUMNS, reads.log_statement
    except (ImportError, AttributeError):  # pragma: no cover - the store's private layout
        return None


_STORE_SQL: Final = _store_sql()

_OUTER: Final = {
    name: sql.SQL("(extract(epoch FROM s.recorded_at) * 1000000)::bigint")
    if name == "recorded_at" else sql.SQL("s.{}").format(sql.Identifier(name))
    for name in EVENTS_ARROW_SCHEMA.names
}


def events_schema(columns: Sequence[str] | None = None) -> pa.Schema:
    """``EVENTS_ARROW_SCHEMA``, or the part of it with ``columns`` (in the schema's order)."""
    if columns is None:
        return EVENTS_ARROW_SCHEMA
    unknown = sorted(set(columns) - set(EVENTS_ARROW_SCHEMA.names))
    if unknown:
        raise SparkLayerError(
            f"unknown event column(s) {', '.join(unknown)}; the columns are "
            f"{', '.join(EVENTS_ARROW_SCHEMA.names)}"
        )
    return pa.schema([f for f in EVENTS_ARROW_SCHEMA if f.name in set(columns)])


def store_log_select(conn: psycopg.Connection[Any], lo: int, hi: int, *,
                     category: str | None = None, types: list[str] | None = None
                     ) -> sql.Composed:
    """The store's own read of positions ``[lo, hi)`` as one literal SELECT whose columns are
    named like ``EVENTS_ARROW_SCHEMA`` (``recorded_at`` still a timestamptz)."""
    if _STORE_SQL is None:  # pragma: no cover - see _store_sql
        raise SparkLayerError("the event store's log statement is not available")
    columns, log_statement = _STORE_SQL
    inner = log_statement(
        columns, category=category is not None, types=types is not None,
        include_deleted=False, bounded=True,
    )
    params = {"from": lo, "to": hi, "limit": max(hi - lo, 1), "category": category,
              "types": types}
    literal = psycopg.ClientCursor(conn).mogrify(inner, params)
    return sql.SQL("SELECT * FROM ({inner}) AS s({names})").format(
        inner=sql.SQL(literal),
        names=sql.SQL(", ").join(sql.Identifier(n) for n in EVENTS_ARROW_SCHEMA.names),
    )


def _statement(conn: psycopg.Connection[Any], lo: int, hi: int, category: str | None,
               types: list[str] | None, schema: pa.Schema) -> sql.Composed:
    """``COPY (<the store's log read, parameters as literals>) TO STDOUT`` of ``schema``'s
    columns (COPY takes no bind parameters)."""
    select = store_log_select(conn, lo, hi, category=category, types=types)
    return sql.SQL("COPY (SELECT {outer} FROM ({select}) AS s) TO STDOUT (FORMAT csv)").format(
        outer=sql.SQL(", ").join(_OUTER[name] for name in schema.names), select=select,
    )


def _parse(buffer: bytes, schema: pa.Schema) -> pa.Table:
    csv_types = {f.name: pa.int64() if f.name == "recorded_at" else f.type for f in schema}
    table = pacsv.read_csv(
        io.BytesIO(buffer),
        # One thread: a Spark task owns one core; Arrow's thread pool on top of Spark's
        # tasks made parsing 4x slower on a 2-core machine.
        read_options=pacsv.ReadOptions(column_names=schema.names, block_size=8 << 20,
                                       use_threads=False),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types=csv_types, null_values=[""], strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )
    index = table.schema.get_field_index("recorded_at")
    if index >= 0:
        recorded = pc.cast(table.column(index), pa.timestamp("us", tz="UTC"))
        table = table.set_column(index, EVENTS_ARROW_SCHEMA.field("recorded_at"), recorded)
    return table.cast(schema)


def copy_events_range(dsn: str, start: int, end: int, *, category: str | None = None,
                      types: Sequence[str] | None = None,
                      columns: Sequence[str] | None = None,
                      page_positions: int = 200_000) -> Iterator[pa.RecordBatch]:
    """The events at global positions ``[start, end)``, in position order, as record batches
    of ``EVENTS_ARROW_SCHEMA`` (or of its ``columns`` only: less to transfer and parse), one
    COPY per page of ``page_positions`` positions."""
    schema = events_schema(columns)
    if end <= start:
        return
    if _STORE_SQL is None:  # pragma: no cover - see the import above
        for batch in read_events_range(dsn, start, end, category=category, types=types):
            yield batch.select(schema.names)
        return
    type_list = [*types, STREAM_DELETED_TYPE] if types else None
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as e:
        raise SourceUnavailable(
            f"cannot connect to the event store at {mask_dsn(dsn)}: {str(e).strip()}; "
            "check the DSN and that the server runs"
        ) from e
    with conn:
        # The store's statement orders by its primary key under a LIMIT; with a fresh table's
        # statistics the planner picked a bitmap scan plus an on-disk sort (2x slower than the
        # ordered index scan), and parallel workers only compete with Spark's own tasks.
        for setting in ("enable_sort", "enable_bitmapscan"):
            conn.execute(sql.SQL("SET {} = off").format(sql.Identifier(setting)))
        conn.execute("SET max_parallel_workers_per_gather = 0")
        lo = max(start, 1)
        while lo < end:
            hi = min(end, lo + page_positions)
            chunks = io.BytesIO()
            try:
                with conn.cursor() as cursor, cursor.copy(
                    _statement(conn, lo, hi, category, type_list, schema)
                ) as copy:
                    for chunk in copy:
                        chunks.write(chunk)
            except psycopg.errors.UndefinedTable as e:
                raise SparkLayerError(
                    f"the event store is not installed at {mask_dsn(dsn)}; run "
                    "`lakefold events install` or EventStore(dsn).install() first"
                ) from e
            except psycopg.OperationalError as e:
                raise SourceUnavailable(
                    f"reading events {lo}..{hi} from {mask_dsn(dsn)} failed: {e}"
                ) from e
            if chunks.tell():
                yield from _parse(chunks.getvalue(), schema).to_batches(max_chunksize=100_000)
            lo = hi
