"""Reading changelog streams: ``ChangelogStore`` and ``read_changelog_range``.

Positions
    Every stream numbers its records 1, 2, 3, ... in commit order (the capture is the only
    writer, so they are assigned densely). ``head(stream)`` is the last position readers may
    see; it moves only at source-transaction boundaries, so a reader never sees half a source
    transaction. Compaction removes superseded records below the head, leaving gaps: never
    assume position ``p + 1`` exists, read ranges instead.

Ranges
    ``read(stream, from_position, limit)``: records with ``position >= from_position``
    (inclusive; 0 and 1 both mean "from the start"), at most ``limit``, up to the head.
    ``read_changelog_range(store_dsn, stream, start, end)``: the half-open range
    ``[start, end)``, capped at the head. A consumer that processed position ``p`` continues
    with ``from_position = p + 1``.

Typed rows
    Reads return Arrow tables: the metadata columns ``_position``, ``_op`` (``insert``,
    ``update``, ``delete``, ``truncate``, ``read``), ``_commit_lsn``, ``_ordinal``, ``_xid``,
    ``_commit_ts``, ``_schema_version``, then one typed column per column of the table (see
    ``_arrow_columns`` for the types). An insert or update carries the new row; a delete carries the
    key columns (all columns under ``REPLICA IDENTITY FULL``); a truncate carries nulls.
    Records of older schema versions are mapped by column name onto the newest version's
    columns. ``read_events`` returns full ``ChangeEvent`` models (with before-images) instead.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from psycopg import sql

from lakefold.core.dsn import error_text, mask_dsn
from lakefold.schemas.change import ChangeEvent, ChangeSource, Operation
from lakefold.store import _ddl, _reader_registry, _snapshot_segments
from lakefold.store._arrow_columns import arrow_type, typed_array
from lakefold.store._captures import CaptureInfo, list_captures
from lakefold.store._changelog_writer import NOTIFY_CHANNEL, split_key
from lakefold.store._reader_registry import CompactionState, ReaderPosition
from lakefold.store._stream_schema import StreamSchema
from lakefold.store._text_values import convert_row
from lakefold.store.exceptions import (
    CaptureValueError,
    StoreError,
    StoreUnavailableError,
    UnknownStreamError,
)

META_SCHEMA: Final = pa.schema([
    pa.field("_position", pa.int64(), nullable=False),
    pa.field("_op", pa.string(), nullable=False),
    pa.field("_commit_lsn", pa.int64(), nullable=False),
    pa.field("_ordinal", pa.int64(), nullable=False),
    pa.field("_xid", pa.int64(), nullable=False),
    pa.field("_commit_ts", pa.timestamp("us", tz="UTC"), nullable=False),
    pa.field("_schema_version", pa.int32(), nullable=False),
])
_CSV_META_TYPES: Final = {
    "_position": pa.int64(), "_op": pa.string(), "_commit_lsn": pa.int64(),
    "_ordinal": pa.int64(), "_xid": pa.int64(), "_commit_ts": pa.int64(),
    "_schema_version": pa.int32(),
}
_DEFAULT_CHUNK: Final = 65_536
#: The streams as the store lists them, each with the source of its capture (``c``: its
#: capture_slots row; the source read through to_jsonb so that a store not yet migrated to the
#: column answers too). Not what the readers' ``stream_meta`` reads: they need no source.
_LISTED: Final = (
    "SELECT name, stream_id, s.slot_name, s.source_database, source_schema, source_table, "
    "head, schema_version, s.last_commit_ts, coalesce(to_jsonb(c) ->> 'source', '') "
    "FROM lakefold.changelog_streams s LEFT JOIN lakefold.capture_slots c USING (slot_name) ")
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class ChangelogStreamInfo:
    """A changelog stream: its name (``schema.table`` with the capture's prefix), where it
    comes from, its head (last visible position) and current schema version."""

    name: str
    stream_id: int
    slot: str
    database: str
    schema: str
    table: str
    head: int
    schema_version: int
    last_commit_ts: datetime | None
    #: The source of the capture writing it, ``host:port/database`` (no role, no password);
    #: empty for a view's output stream, for a capture recorded before sources were, and in
    #: the readers' ``stream_meta`` (filled by the store's listings: ``streams``, ``stream``).
    source: str = ""


def _listed(row: Any) -> ChangelogStreamInfo:
    """A stream of ``_LISTED``."""
    return ChangelogStreamInfo(row[0], int(row[1]), row[2], row[3], row[4], row[5],
                               int(row[6]), int(row[7]), row[8], row[9])


def connect_store(dsn: str) -> psycopg.Connection[Any]:
    """An autocommit connection to the store; StoreUnavailableError when unreachable."""
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as e:
        raise StoreUnavailableError(
            f"cannot connect to the changelog store at {mask_dsn(dsn)}: "
            f"{error_text(e)}; check the store DSN and that the server is running") from e
    conn.execute("SET TIME ZONE 'UTC'")
    return conn


@dataclass(frozen=True, slots=True)
class StreamMeta:
    info: ChangelogStreamInfo
    versions: dict[int, StreamSchema]

    @property
    def latest(self) -> StreamSchema | None:
        return self.versions[max(self.versions)] if self.versions else None

    @property
    def width(self) -> int:
        return max((len(s.columns) for s in self.versions.values()), default=0)


def stream_meta(conn: psycopg.Connection[Any], stream: str) -> StreamMeta:
    try:
        row = conn.execute(
            "SELECT stream_id, slot_name, source_database, source_schema, source_table, head, "
            "schema_version, last_commit_ts FROM lakefold.changelog_streams WHERE name = %s",
            (stream,),
        ).fetchone()
    except psycopg.errors.UndefinedTable as e:
        raise StoreError("the changelog store is not installed in this database; run a "
                         "capture first, or ChangelogStore(dsn).install()") from e
    if row is None:
        known = [r[0] for r in conn.execute(
            "SELECT name FROM lakefold.changelog_streams ORDER BY name").fetchall()]
        raise UnknownStreamError(
            f"no changelog stream {stream!r}; known streams: "
            f"{', '.join(known) if known else '(none yet: is a capture running?)'}")
    info = ChangelogStreamInfo(stream, int(row[0]), row[1], row[2], row[3], row[4], int(row[5]),
                      int(row[6]), row[7])
    versions = {}
    for version, oid, identity, schema, table, columns, keyless in conn.execute(
        "SELECT version, relation_oid, replica_identity, source_schema, source_table, columns, "
        "keyless FROM lakefold.changelog_schemas WHERE stream_id = %s ORDER BY version",
        (info.stream_id,),
    ).fetchall():
        versions[int(version)] = StreamSchema(
            stream=stream, version=int(version), database=info.database, schema=schema,
            table=table, relation_oid=int(oid), replica_identity=identity,
            columns=StreamSchema.columns_from_json(columns), keyless=bool(keyless))
    return StreamMeta(info, versions)


def _raw_columns(width: int) -> tuple[list[str], dict[str, pa.DataType]]:
    names = list(_CSV_META_TYPES) + [f"v{i + 1}" for i in range(width)]
    return names, dict(_CSV_META_TYPES) | {f"v{i + 1}": pa.string() for i in range(width)}


def empty_raw(meta: StreamMeta) -> pa.Table:
    """No records, in the raw layout ``copy_records`` returns for ``meta``."""
    names, types = _raw_columns(meta.width)
    return pa.schema([(n, types[n]) for n in names]).empty_table()


@contextmanager
def _one_snapshot(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A read-only transaction whose statements all see one snapshot. A read of rows and
    segments needs it: compaction turns segments into rows meanwhile, so a later statement's
    snapshot may no longer hold a segment whose records the rows did not have yet."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


def _copy_range(conn: psycopg.Connection[Any], meta: StreamMeta, start: int, end: int,
                limit: int | None) -> pa.Table:
    """Records with ``start <= position < end`` as a table of metadata columns and the text
    values ``v1..vN``."""
    with _one_snapshot(conn):
        rows = _copy_rows(conn, meta, start, end, limit)
        if limit is not None and rows.num_rows == limit:  # later segment records come after
            end = int(rows.column("_position")[-1].as_py())
        parts = [_segment_raw(segment, texts, meta.width) for segment, texts in
                 _snapshot_segments.read_range(conn, meta.info.stream_id, start, end, limit)]
    if not parts:
        return rows
    merged = pa.concat_tables([rows, *parts]).sort_by("_position")
    return merged if limit is None else merged.slice(0, limit)


def _copy_rows(conn: psycopg.Connection[Any], meta: StreamMeta, start: int, end: int,
               limit: int | None) -> pa.Table:
    """The changelog rows (not the segments) of ``_copy_range``."""
    return copy_records(conn, meta, sql.SQL(
        "SELECT *, COALESCE(after, before) AS v FROM lakefold.changelog "
        "WHERE stream_id = {sid} AND position >= {lo} AND position < {hi} "
        "ORDER BY position {limit}"
    ).format(
        sid=sql.Literal(meta.info.stream_id), lo=sql.Literal(start), hi=sql.Literal(end),
        limit=sql.SQL("LIMIT {}").format(sql.Literal(limit)) if limit is not None
        else sql.SQL(""),
    ))


def copy_records(conn: psycopg.Connection[Any], meta: StreamMeta,
                 records: sql.Composable) -> pa.Table:
    """The records a query yields (columns ``position, op, commit_lsn, ordinal, xid,
    commit_ts, schema_version`` and the text values ``v``) as the raw table ``typed``
    takes: the metadata columns and ``v1..vN``, in position order."""
    width = meta.width
    values = [sql.SQL("c.v[{}]").format(sql.Literal(i + 1)) for i in range(width)]
    query = sql.SQL(
        "COPY (SELECT c.position, CASE c.op WHEN 'i' THEN 'insert' WHEN 'u' THEN 'update' "
        "WHEN 'd' THEN 'delete' WHEN 't' THEN 'truncate' ELSE 'read' END, c.commit_lsn, "
        "c.ordinal, c.xid, (extract(epoch FROM c.commit_ts) * 1000000)::bigint, "
        "c.schema_version{values} FROM ({records}) c ORDER BY c.position) "
        "TO STDOUT (FORMAT csv, FORCE_QUOTE *)"
    ).format(values=sql.SQL("").join(sql.SQL(", ") + v for v in values), records=records)
    buffer = io.BytesIO()
    with conn.cursor() as cur, cur.copy(query) as copy:
        for chunk in copy:
            buffer.write(chunk)
    if buffer.tell() == 0:
        return empty_raw(meta)
    buffer.seek(0)
    names, types = _raw_columns(width)
    return pacsv.read_csv(
        buffer,
        read_options=pacsv.ReadOptions(column_names=names, block_size=16 << 20),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types=types, null_values=[""], strings_can_be_null=True,
            quoted_strings_can_be_null=False),
    )


def _segment_raw(segment: _snapshot_segments.Segment, texts: pa.Table, width: int) -> pa.Table:
    """A segment's records in the layout of ``_copy_range``."""
    n = texts.num_rows
    names, types = _raw_columns(width)
    since_epoch = (segment.commit_ts - _EPOCH) // timedelta(microseconds=1)
    meta = [
        pa.array(np.arange(segment.first_position, segment.first_position + n)),
        pa.array(["read"] * n, pa.string()),
        pa.array(np.full(n, segment.commit_lsn, dtype=np.int64)),
        pa.array(np.arange(segment.first_ordinal, segment.first_ordinal + n)),
        pa.array(np.zeros(n, dtype=np.int64)),
        pa.array(np.full(n, since_epoch, dtype=np.int64)),
        pa.array(np.full(n, segment.schema_version, dtype=np.int32)),
    ]
    values = [texts.column(i) if i < texts.num_columns else pa.nulls(n, pa.string())
              for i in range(width)]
    return pa.Table.from_arrays([*meta, *values], schema=pa.schema(
        [(name, types[name]) for name in names]))


def typed(raw: pa.Table, meta: StreamMeta) -> pa.Table:
    """The raw table with ``v1..vN`` replaced by the typed columns of the newest version."""
    target = meta.latest
    columns = target.columns if target is not None else ()
    commit_ts = pc.cast(raw.column("_commit_ts"), pa.timestamp("us", tz="UTC"))
    head = [raw.column(n) for n in META_SCHEMA.names]
    head[META_SCHEMA.names.index("_commit_ts")] = commit_ts
    fields = list(META_SCHEMA) + [pa.field(c.name, arrow_type(c)) for c in columns]
    out_schema = pa.schema(fields)
    if raw.num_rows == 0:
        return out_schema.empty_table()
    versions = pc.unique(raw.column("_schema_version")).to_pylist()
    if len(versions) == 1 and target is not None and versions[0] == target.version:
        typed = [typed_array(c, raw.column(f"v{i + 1}")) for i, c in enumerate(columns)]
        return pa.Table.from_arrays([*head, *typed], schema=out_schema)
    # Several schema versions: type each group with its own columns, map by name.
    parts = []
    base = pa.Table.from_arrays(head, schema=META_SCHEMA)
    for version in versions:
        mask = pc.equal(raw.column("_schema_version"), version)
        group = raw.filter(mask)
        own = meta.versions.get(version)
        by_name = {c.name: (i, c) for i, c in enumerate(own.columns)} if own else {}
        arrays = []
        for column in columns:
            found = by_name.get(column.name)
            wanted = arrow_type(column)
            if found is None:
                arrays.append(pa.nulls(group.num_rows, type=wanted))
                continue
            index, old = found
            values = typed_array(old, group.column(f"v{index + 1}"))
            if values.type != wanted:
                try:
                    values = pc.cast(values, wanted)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    values = typed_array(column, group.column(f"v{index + 1}"))
            arrays.append(values)
        parts.append(pa.Table.from_arrays([*base.filter(mask).columns, *arrays],
                                          schema=out_schema))
    return pa.concat_tables(parts).sort_by("_position")


def read_changelog_range(store_dsn: str, stream: str, start: int, end: int, *,
                         batch_rows: int = _DEFAULT_CHUNK) -> Iterator[pa.RecordBatch]:
    """Records of ``stream`` with ``start <= position < end`` (capped at the head), as typed
    Arrow record batches (see the module docstring), in position order.

    Self-contained and picklable (a module-level function taking only strings and ints), so
    Spark's Python workers can call it for a partition of a range; it opens and closes its own
    connection.
    """
    with connect_store(store_dsn) as conn:
        yield from _read_range(conn, stream, start, end, batch_rows)


def _read_range(conn: psycopg.Connection[Any], stream: str, start: int, end: int,
                batch_rows: int) -> Iterator[pa.RecordBatch]:
    """``read_changelog_range`` on ``conn``."""
    meta = stream_meta(conn, stream)
    end = min(end, meta.info.head + 1)
    position = max(start, 1)
    while position < end:
        upper = min(end, position + batch_rows)
        table = typed(_copy_range(conn, meta, position, upper, None), meta)
        yield from table.to_batches()
        position = upper


def _segment_records(conn: psycopg.Connection[Any], meta: StreamMeta, start: int, end: int,
                     limit: int) -> list[tuple[Any, ...]]:
    """The segments' records in ``[start, end)`` as the rows ``read_events`` selects."""
    records: list[tuple[Any, ...]] = []
    for segment, texts in _snapshot_segments.read_range(conn, meta.info.stream_id, start, end,
                                                        limit):
        schema = meta.versions[segment.schema_version]
        keys = _snapshot_segments.record_keys(
            texts, [i for i, c in enumerate(schema.columns) if c.key])
        values = zip(*(texts.column(i).to_pylist() for i in range(texts.num_columns)),
                     strict=True)
        for i, (key, after) in enumerate(zip(keys, values, strict=True)):
            records.append((segment.first_position + i, "r", segment.commit_lsn,
                            segment.first_ordinal + i, 0, segment.commit_ts,
                            segment.schema_version, key, None, list(after)))
    return records


def _key_texts(key: bytes | None) -> list[str | None] | None:
    if key is None:
        return None
    return [None if v is None else v.decode() for v in split_key(key)]


class ChangelogStore:
    """The changelog streams in a store database (schema ``lakefold``).

    Not thread-safe: it keeps one connection. Positions and ranges: see the module docstring.
    """

    def __init__(self, store_dsn: str) -> None:
        self.dsn = store_dsn
        self._conn: psycopg.Connection[Any] | None = None
        self._reader_streams: dict[str, int] = {}  # commit_reader's streams: name → id

    def connection(self) -> psycopg.Connection[Any]:
        """The store's autocommit connection, reopened after a loss."""
        if self._conn is None or self._conn.closed:
            self._conn = connect_store(self.dsn)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> ChangelogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def install(self) -> None:
        """Create the ``lakefold`` schema and changelog tables if missing (idempotent)."""
        _ddl.install(self.connection())

    def streams(self) -> list[ChangelogStreamInfo]:
        """All streams, by name."""
        conn = self.connection()
        if not _ddl.is_installed(conn):
            return []
        return [_listed(r) for r in conn.execute(_LISTED + "ORDER BY name").fetchall()]

    def captures(self) -> list[CaptureInfo]:
        """Every capture the store records (each source's slot), with its source, stream
        prefix and streams, by slot; read from the store alone."""
        return list_captures(self.connection())

    def stream(self, stream: str) -> ChangelogStreamInfo:
        """One stream, as ``streams`` lists it; UnknownStreamError (listing the known ones)
        when missing."""
        conn = self.connection()
        info = stream_meta(conn, stream).info  # raises for a missing stream or store
        row = conn.execute(_LISTED + "WHERE name = %s", (stream,)).fetchone()
        return _listed(row) if row is not None else info

    def head(self, stream: str) -> int:
        """The last position readers may see (0 for an empty stream)."""
        return stream_meta(self.connection(), stream).info.head

    def truncates(self, stream: str, start: int, end: int) -> list[tuple[int, datetime]]:
        """The truncate records of ``stream`` at positions ``[start, end)`` (up to the head)
        as ``(position, commit_ts)``, in position order. Truncates are never in segments, and
        the tombstone index covers them: this reads no other record."""
        conn = self.connection()
        meta = stream_meta(conn, stream)
        rows = conn.execute(
            "SELECT position, commit_ts FROM lakefold.changelog WHERE stream_id = %s "
            "AND op IN ('d', 't') AND op = 't' AND position >= %s AND position < %s "
            "AND position <= %s ORDER BY position",
            (meta.info.stream_id, max(start, 1), end, meta.info.head)).fetchall()
        return [(int(position), ts) for position, ts in rows]

    def stream_schema(self, stream: str, version: int | None = None) -> StreamSchema:
        """The captured table's columns (name, type OID, type name, key flag) at ``version``
        (default: the newest)."""
        meta = stream_meta(self.connection(), stream)
        if not meta.versions:
            raise StoreError(f"stream {stream!r} has no schema yet (no change captured)")
        if version is None:
            return meta.versions[max(meta.versions)]
        if version not in meta.versions:
            raise StoreError(f"stream {stream!r} has no schema version {version}; versions: "
                             f"{', '.join(map(str, sorted(meta.versions)))}")
        return meta.versions[version]

    def read_range(self, stream: str, start: int, end: int) -> pa.Table:
        """``read_changelog_range`` on the store's connection, as one table."""
        return pa.Table.from_batches(
            _read_range(self.connection(), stream, start, end, _DEFAULT_CHUNK))

    def read(self, stream: str, from_position: int = 1, limit: int = 10_000) -> pa.Table:
        """Up to ``limit`` records with ``position >= from_position`` (and <= head), typed."""
        if limit < 1:
            raise CaptureValueError(f"limit must be at least 1, not {limit}")
        conn = self.connection()
        meta = stream_meta(conn, stream)
        start = max(from_position, 1)
        if start > meta.info.head:
            return typed(empty_raw(meta), meta)
        return typed(_copy_range(conn, meta, start, meta.info.head + 1, limit), meta)

    def read_events(self, stream: str, from_position: int = 1,
                    limit: int = 1_000) -> list[ChangeEvent]:
        """Up to ``limit`` records as ChangeEvent models, with before-images and exact values."""
        conn = self.connection()
        meta = stream_meta(conn, stream)
        with _one_snapshot(conn):
            rows: list[tuple[Any, ...]] = conn.execute(
                "SELECT position, op, commit_lsn, ordinal, xid, commit_ts, schema_version, "
                "key, before, after FROM lakefold.changelog WHERE stream_id = %s "
                "AND position >= %s AND position <= %s ORDER BY position LIMIT %s",
                (meta.info.stream_id, max(from_position, 1), meta.info.head, limit),
            ).fetchall()
            rows += _segment_records(conn, meta, max(from_position, 1), meta.info.head + 1,
                                     limit)
        events = []
        for position, op, lsn, ordinal, xid, ts, version, key, before, after in sorted(
                rows, key=lambda r: int(r[0]))[:limit]:
            schema = meta.versions[int(version)]
            key_columns = tuple(c for c in schema.columns if c.key)
            events.append(ChangeEvent(
                source=ChangeSource(database=schema.database, schema_name=schema.schema,
                                    table=schema.table),
                operation=Operation.from_code(op),
                key=convert_row(key_columns, _key_texts(key)),
                before=convert_row(schema.columns, before),
                after=convert_row(schema.columns, after), commit_lsn=lsn, ordinal=ordinal,
                xid=xid, commit_ts=ts, schema_version=version, position=position,
            ))
        return events

    def follow(self, stream: str, from_position: int = 1, *, batch_size: int = 10_000,
               stop: Any = None, poll_interval: float = 1.0,
               wait_for_stream: bool = False) -> Iterator[pa.Table]:
        """Tail ``stream``: yield tables of new records as they become visible, woken by
        LISTEN/NOTIFY, re-checking every ``poll_interval`` seconds even without a
        notification (a missed NOTIFY delays, never loses). Ends when ``stop`` (a
        ``threading.Event``) is set. No checkpoint is kept. ``wait_for_stream`` waits for a
        stream that does not exist yet (its table has no captured change yet) instead of
        raising UnknownStreamError."""
        listener = connect_store(self.dsn)
        try:
            listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))
            position = max(from_position, 1)
            while stop is None or not stop.is_set():
                try:
                    table = self.read(stream, position, batch_size)
                except (UnknownStreamError, StoreError):
                    if not wait_for_stream:
                        raise
                    table = pa.table({})
                if table.num_rows:
                    position = int(table.column("_position")[-1].as_py()) + 1
                    yield table
                    continue
                for notify in listener.notifies(timeout=poll_interval):
                    if notify.payload == stream:
                        break
                    if stop is not None and stop.is_set():
                        break
        finally:
            listener.close()

    def compact(self, stream: str | None = None, *, tombstone_retention: timedelta | None = None,
                chunk_positions: int = 50_000) -> dict[str, int]:
        """Compact one stream (or all): keep the latest record per key, drop tombstones older
        than ``tombstone_retention`` (a timedelta; default 24 h), never past the lowest
        position of a durable reader (``commit_reader``), never in a stream that keeps its
        full history. Online: short transactions, no locks that block the capture or readers.
        Returns records removed per stream."""
        from lakefold.store._compaction import compact_stream, default_retention

        conn = self.connection()
        names = [stream] if stream is not None else [s.name for s in self.streams()]
        if names and not _reader_registry.installed(conn):  # a store installed by an older lakefold
            _ddl.install(conn)
        removed = {}
        for name in names:
            info = stream_meta(conn, name).info
            removed[name] = compact_stream(
                conn, info.stream_id,
                retention=tombstone_retention if tombstone_retention is not None
                else default_retention(), chunk_positions=chunk_positions)
        return removed

    # ------------------------------------------------------------------ durable readers

    def commit_reader(self, reader: str, stream: str, position: int, *,
                      history: bool = False) -> None:
        """Record that the durable reader ``reader`` has processed ``stream`` up to
        ``position`` (0: nothing yet), once the effect of processing it is committed.
        Compaction then keeps every record after the lowest such position of the stream.

        ``history``: the reader keeps every version (SCD2, an append log), not just the latest
        state per key. Raises ReaderBehindCompactionError (nothing is registered) when
        compaction already removed records after ``position`` that such a reader needs: for a
        history reader any record, for another one that has read something the deletes
        (see ``_reader_registry``)."""
        conn = self.connection()
        stream_id = self._reader_streams.get(stream)
        if stream_id is None:  # once per stream: commits come with every micro-batch
            stream_id = stream_meta(conn, stream).info.stream_id
            if not _reader_registry.installed(conn):  # a store installed by an older lakefold
                _ddl.install(conn)
            self._reader_streams[stream] = stream_id
        _reader_registry.commit(conn, reader, stream_id, stream, position, history=history)

    def release_reader(self, reader: str, stream: str | None = None) -> int:
        """Forget a durable reader (in one stream, or in all) so that it no longer holds
        compaction; returns how many registrations went."""
        conn = self.connection()
        stream_id = None if stream is None else stream_meta(conn, stream).info.stream_id
        if not _reader_registry.installed(conn):
            return 0
        return _reader_registry.release(conn, reader, stream_id)

    def readers(self, stream: str | None = None) -> list[ReaderPosition]:
        """The durable readers (of one stream, or of all), lowest position first."""
        conn = self.connection()
        stream_id = None if stream is None else stream_meta(conn, stream).info.stream_id
        if not _reader_registry.installed(conn):
            return []
        return _reader_registry.readers(conn, stream_id)

    def compaction_state(self, stream: str) -> CompactionState:
        """How far ``stream`` is compacted, what compaction removed, whether it keeps its full
        history, and its durable readers (``held_by``: the one compaction cannot pass)."""
        conn = self.connection()
        info = stream_meta(conn, stream).info
        if not _reader_registry.installed(conn):
            _ddl.install(conn)
        return _reader_registry.state(conn, info.stream_id, stream)

    def keep_history(self, stream: str, keep: bool = True, *, reason: str | None = None,
                     if_unset: bool = False) -> bool:
        """Make ``stream`` keep its full history (compaction leaves it alone) or let it be
        compacted again; ``reason`` is shown in its compaction state. With ``if_unset``, only
        when nobody decided yet for the stream (what history views ask for when registered;
        an explicit ``keep_history(stream, False)`` stands). True when this changed the
        setting. Records compaction removed before stay removed."""
        conn = self.connection()
        info = stream_meta(conn, stream).info
        if not _reader_registry.installed(conn):
            _ddl.install(conn)
        default = "asked for by a user" if keep else "switched off by a user"
        return _reader_registry.set_keep_history(conn, info.stream_id, keep, reason or default,
                                                 if_unset=if_unset)


def data_columns(table: pa.Table) -> pa.Table:
    """A read's rows without their metadata columns (``_position``, ``_op``, ...)."""
    return table.drop_columns([c for c in table.column_names if c.startswith("_")])


def row_schema(store: ChangelogStore, stream: str) -> pa.Schema:
    """The Arrow schema of a stream's rows as its newest version types them (no
    metadata columns)."""
    return data_columns(store.read(stream, from_position=2**62, limit=1)).schema
